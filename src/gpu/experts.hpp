// experts (GPU): the grouped GEMM of the MoE experts, the gpt-oss experts op (router, top-k, the
// routed experts, the weighted combine) and the MXFP4 decode of the experts' weights on
// DeviceTensors, with the CPU ops' contracts (src/ops/moe/grouped_gemm.hpp, experts.hpp,
// src/ops/mxfp4.hpp).
#pragma once

#include <cstdint>
#include <span>

#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/moe.hpp"
#include "src/ops/moe/types.hpp"

namespace meshtest::gpu {

/// grouped_gemm on the GPU, queued on blas.stream(): out[offsets[e] : offsets[e+1]] =
/// x[offsets[e] : offsets[e+1]] · w[e]ᵀ (+ bias[e]), one cuBLASLt GEMM per non-empty segment on
/// views of x and out (an empty segment queues nothing), the segments spread over Blas's side
/// streams and joined back to its stream (Blas::gemm_segments).
///   x: [rows, in], offsets: [G + 1] (host) from 0 to rows, non-decreasing, w: [G, out, in],
///   bias: [G, out] or null  ->  [rows, out], x's dtype
/// f32 or bf16, products accumulated in f32 with the bias joining the sum before the one
/// rounding (the CPU op rounds bf16's product and bias sum apart: within the error model).
/// (cuBLAS's cublasGemmGroupedBatchedEx, one call for every segment, measured 1.2-1.8x slower
/// than this at gpt-oss-20b's expert GEMMs on an H200: docs/moe.md.) Throws Error for offsets
/// that do not fit rows and G, shapes, dtypes or devices that disagree.
DeviceTensor grouped_gemm(Blas& blas, const DeviceTensor& x, std::span<const std::int64_t> offsets,
                          const DeviceTensor& w, const DeviceTensor* bias = nullptr);

/// grouped_gemm with the offsets on the device (i64 [G + 1], as a DevicePermutation holds them):
/// no host round trip, so that it can be captured in a CUDA graph. The segments are cut into
/// chunks of equal rows (a power of two from 16 to 128, about a quarter of rows / G, at most
/// rows), each chunk a GEMM of one cublasGemmBatchedEx call over the chunks' pointers (planned
/// on the GPU) into an f32 scratch; a last kernel takes every row from its chunk and adds the
/// bias in f32 before the one rounding to x's dtype (as the host-offset form's epilogue). A
/// partial chunk computes rows it does not keep, and the call counts for the most chunks any
/// partition of the rows can need (rows / chunk + G): more FLOPs than the host-offset form, in
/// one launch. Within the error model of the CPU op as the other form (another summation order).
/// Throws Error as the other form for shapes, dtypes and devices; offsets that do not run from
/// 0 to rows, non-decreasing, are clamped on the GPU (no row is read or written out of range)
/// and, outside a capture, raise an Error naming the first bad one after the stream is
/// synchronized (the only synchronization; a capture checks nothing, as IndexFlag says).
DeviceTensor grouped_gemm(Blas& blas, const DeviceTensor& x, const DeviceTensor& offsets,
                          const DeviceTensor& w, const DeviceTensor* bias = nullptr);

/// Where the experts op's grouped GEMMs learn the rows of each expert.
enum class Segments {
  host,    ///< copied back after make_permutation (one synchronization of the stream), then one
           ///< cuBLASLt GEMM per expert (grouped_gemm with host offsets): the fastest at prefill
  device,  ///< left on the GPU (grouped_gemm with device offsets): no synchronization of its
           ///< own, so the op can be captured in a CUDA graph and replayed on new tokens
};

/// The experts op (src/ops/moe/experts.hpp) on the GPU, queued on blas.stream(): the router
/// (linear, then gate: top-k then softmax), make_permutation, permute, grouped GEMM over mlp1,
/// swiglu, grouped GEMM over mlp2 (with its bias), unpermute.
///   t: [T, hidden], gate_weight: [E, hidden], gate_bias: [E], mlp1_weight: [E, 2I, hidden],
///   mlp1_bias: [E, 2I], mlp2_weight: [E, hidden, I], mlp2_bias: [E, hidden] or DeviceTensor{}
///   (no bias: a tensor-parallel device's partial sum, dist/gpu/parallel/tp_experts.hpp)
///   ->  [T, hidden]
/// f32 or bf16. The router's GEMM sums in cuBLASLt's order, not the CPU's: where two experts'
/// logits lie within that error of each other the choice may differ from the CPU's; the tests'
/// rule compares routes only where the top-k margin exceeds the logits' bound, and the experts
/// from a given routing (experts_routed) everywhere. Synchronizes blas's stream to read its
/// checks (a NaN logit, an expert id) and, with Segments::host, the segment sizes; while this
/// thread captures a gpu::Graph, with Segments::device, it queues everything and reads nothing
/// (Segments::host cannot be captured: an Error). Errors as the CPU op's (shapes, dtypes, k, a
/// NaN logit) and for tensors on another device than blas's.
DeviceTensor experts(Blas& blas, const DeviceTensor& t, const DeviceTensor& gate_weight,
                     const DeviceTensor& gate_bias, const DeviceTensor& mlp1_weight,
                     const DeviceTensor& mlp1_bias, const DeviceTensor& mlp2_weight,
                     const DeviceTensor& mlp2_bias, const MoeParams& p = {},
                     Segments segments = Segments::host);

/// The experts of `routing` (r.k = p.experts_per_token is not required: the routing's k is
/// used) without the router: permute, the two grouped GEMMs and swiglu, unpermute with the
/// routing's weights. Same shapes and errors as experts.
DeviceTensor experts_routed(Blas& blas, const DeviceTensor& t, const DeviceRouting& routing,
                            const DeviceTensor& mlp1_weight, const DeviceTensor& mlp1_bias,
                            const DeviceTensor& mlp2_weight, const DeviceTensor& mlp2_bias,
                            const MoeParams& p = {}, Segments segments = Segments::host);

/// The gradients of the routed experts and combine on the GPU (MoeGrads, src/ops/moe/grad.hpp).
struct DeviceMoeGrads {
  DeviceTensor t;            ///< [T, hidden]
  DeviceTensor weights;      ///< [T, k]
  DeviceTensor mlp1_weight;  ///< [E, 2I, hidden] (zero for an expert with no tokens)
  DeviceTensor mlp1_bias;    ///< [E, 2I]
  DeviceTensor mlp2_weight;  ///< [E, hidden, I]
  DeviceTensor mlp2_bias;    ///< [E, hidden]
};

/// moe_backward on the GPU, f32, queued on blas.stream(): the forward again on the rows grouped
/// by expert (permute, grouped GEMM, swiglu, grouped GEMM), the per-slot terms (the routing
/// weights' gradient, dy), the grouped GEMMs' backward (grad_x = g · W, grad_W = gᵀ · x on
/// cuBLAS, grad_b = the column sums of g over the segment's rows), swiglu's backward, and each
/// token's rows summed back (unpermute with unit weights). The routing is held fixed, as on the
/// CPU. Within the CPU op's error model; synchronizes the stream once (the segment sizes).
/// Throws Error for shapes that disagree, a dtype other than f32, or a routing that does not
/// fit t.
DeviceMoeGrads moe_backward(Blas& blas, const DeviceTensor& t, const DeviceRouting& routing,
                            const DeviceTensor& mlp1_weight, const DeviceTensor& mlp1_bias,
                            const DeviceTensor& mlp2_weight, const DeviceTensor& mlp2_bias,
                            const DeviceTensor& grad_out, const MoeParams& p = {});

/// The experts' part of moe_backward on rows already grouped by expert: what moe_backward runs
/// after make_permutation and permute, and what an expert-parallel receiver runs on the rows it
/// was sent. f32, queued on blas.stream(). Row i is the token of slot perm.slots[i]; the forward
/// again (h = W1 x + b1, a = swiglu(h), y = W2 a), the per-row terms (dy = w · grad_row, the
/// weight's grad = grad_row · (y + b2)), the grouped GEMMs' backward and swiglu's.
///   x, grad_rows: [rows, hidden] (each row's token and its grad_out), offsets: perm.offsets on
///   the host, weights: [T, k] by slot, mlp1_weight [G, 2I, hidden], mlp1_bias [G, 2I],
///   mlp2_weight [G, hidden, I], mlp2_bias [G, hidden] or null (zero: where a partial sum
///   leaves the bias to another device)
/// -> DeviceMoeGrads with t: [rows, hidden], each row's grad apart (unpermute with unit
///   weights sums a token's), weights: [T, k] (zero where a slot has no row), and the weight
///   grads [G, ...]. Not synchronized: the caller keeps the inputs alive until the stream is.
///   Throws Error for shapes or dtypes that disagree.
DeviceMoeGrads grouped_experts_backward(
    Blas& blas, const DeviceTensor& x, const DeviceTensor& grad_rows, const DevicePermutation& perm,
    std::span<const std::int64_t> offsets, const DeviceTensor& weights,
    const DeviceTensor& mlp1_weight, const DeviceTensor& mlp1_bias, const DeviceTensor& mlp2_weight,
    const DeviceTensor* mlp2_bias, const MoeParams& p = {});

/// mxfp4_decode (src/ops/mxfp4.hpp) on the GPU, queued on `stream`: the checkpoint's expert
/// weights (blocks u8 [..., nblocks, 16], scales u8 [..., nblocks]) decoded to `out` (bf16, f16,
/// f32 or f64) [..., nblocks * 32], the CPU op's bits (exact unless a scale overflows the type:
/// Inf, as on the host). Throws the CPU op's Errors for the layout and `out`.
DeviceTensor mxfp4_decode(const DeviceTensor& blocks, const DeviceTensor& scales, DType out,
                          cudaStream_t stream);

}  // namespace meshtest::gpu
