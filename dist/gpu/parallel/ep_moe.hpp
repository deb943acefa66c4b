// ep_moe (GPU): expert parallelism on GPU ranks — the MoE block of
// dist/parallel/expert_parallel.hpp with the tokens, the experts' weights and every GEMM on each
// rank's GPU, dispatch and combine by all_to_all_v on device tensors over the mesh's NCCL axes.
//
// The layout and the routes are the CPU ranks' (ep_layout.hpp, ep_routes.hpp): the experts on
// the EP axis with their units split over TP, one row per token and EP device holding one of its
// experts. The routes are planned on the host from the routing on the host (T·k expert ids and
// weights: given to ep_moe, or brought back from the GPU router by ep_mlp_block), by the same
// side exchange (all_to_all_v over MPI) and the same grouping and capacity, so the rows sent and
// received, the permutations and the dropped slots are the CPU ranks' for that routing, bit for
// bit. On the GPU:
//   1. dispatch: the local tokens' rows in the send order (gpu::permute), all_to_all_v on the EP
//      axis;
//   2. the received rows grouped by local expert (the receiver's permutation with the capacity),
//      the grouped GEMMs (mlp1 with its bias, swiglu, mlp2 with its bias on TP device 0), each
//      row's pairs weighted and summed (gpu::unpermute), the sum over the TP axis (all_reduce);
//   3. combine: the reverse all_to_all_v, each token's rows summed over the devices in ascending
//      order (gpu::unpermute with unit weights).
// Numerics: the permutes and unpermutes are the CPU ops' bits on the same inputs, the CCLs the
// CPU path's (exact numerics), the GEMMs cuBLASLt's order: the result is the CPU ranks' ep_moe
// within the error model of docs/tolerances.md (bf16 with the same roundings per step).
//
// Every function is collective over the whole mesh, as on CPU ranks; bad input throws the same
// meshtest::Error on every device before any communication. Ranks are bound to their GPUs
// (dist/gpu/ccl/rank_gpu.hpp) and the tensors are on them.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/gpu/ccl/ccl.hpp"
#include "dist/parallel/ep_layout.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/experts.hpp"
#include "src/ops/moe/types.hpp"

namespace meshtest::dist {

/// An EP device's MLP weights on its GPU: EpMlpWeights's tensors (ep_layout.hpp) copied there.
struct GpuEpMlpWeights {
  ExpertPlacement placement;  ///< the same on every device
  int device = 0;             ///< this device's index on the EP axis
  DeviceTensor norm_scale;    ///< [hidden]
  DeviceTensor gate_weight;   ///< [E, hidden]
  DeviceTensor gate_bias;     ///< [E]
  DeviceTensor mlp1_weight;   ///< [E_local, 2I/tp, hidden]
  DeviceTensor mlp1_bias;     ///< [E_local, 2I/tp]
  DeviceTensor mlp2_weight;   ///< [E_local, hidden, I/tp]
  DeviceTensor mlp2_bias;     ///< [E_local, hidden]
};

/// This device's EP weights (shard_ep_mlp_weights) copied to the current GPU. Local. Throws
/// Error for a dtype the GPU ops do not take (f32 and bf16 do).
GpuEpMlpWeights to_gpu(const EpMlpWeights& w);

/// The routed experts and their combine on GPU ranks (EpMoeResult's fields).
struct GpuEpMoeResult {
  DeviceTensor out;                         ///< [T_local, hidden]
  std::int64_t dropped = 0;                 ///< slots dropped by the capacity over the EP group
  std::vector<std::int64_t> rows_sent;      ///< [D]: rows the dispatch sent to each EP device
  std::vector<std::int64_t> rows_received;  ///< [D]: rows received from each
};

/// ep_moe (dist/parallel/expert_parallel.hpp) on GPU ranks, queued on blas's stream and
/// complete when it returns: t [T_local, hidden] on this rank's GPU (f32 or bf16), r its routing
/// on the host (r.k = p.experts_per_token, weights of t's dtype), w to_gpu of this device's
/// shard. Errors as the host op's, and for tensors of another dtype or on another GPU.
GpuEpMoeResult ep_moe(const MeshDevice& mesh, meshtest::gpu::Blas& blas, const DeviceTensor& t,
                      const Routing& r, const GpuEpMlpWeights& w, const MoeParams& p,
                      const EpOptions& o = {});

/// ep_mlp_block on GPU ranks: t = rms_norm(x); the router on the GPU (linear, then gate: top-k
/// then softmax), its choice brought to the host; out = x + ep_moe(t, r).out.
///   x: [T_local, hidden] (f32 or bf16) -> [T_local, hidden]
/// The router's GEMM sums in cuBLASLt's order: where a token's k-th and (k+1)-th logits lie
/// within that error of each other its experts may differ from the CPU's (the tests' rule,
/// test_gpu_expert_parallel.cpp). Errors as ep_moe's.
DeviceTensor ep_mlp_block(const MeshDevice& mesh, meshtest::gpu::Blas& blas, const DeviceTensor& x,
                          const GpuEpMlpWeights& w, const MoeParams& p, const EpOptions& o = {});

/// ep_moe_backward on GPU ranks, f32: the side exchange, each token's row and grad_out row
/// once per device out, the receiver's experts' forward again and backward
/// (gpu::grouped_experts_backward), [grad of x, the k weight grads] per row summed over TP and
/// returned by the reverse all_to_all_v. DeviceMoeGrads with the fields of MoeGrads as the host
/// op returns them (the local tokens' rows, the local experts' TP slices). Errors as the host
/// op's, and for a dtype other than f32.
meshtest::gpu::DeviceMoeGrads ep_moe_backward(const MeshDevice& mesh, meshtest::gpu::Blas& blas,
                                              const DeviceTensor& t, const Routing& r,
                                              const GpuEpMlpWeights& w,
                                              const DeviceTensor& grad_out, const MoeParams& p,
                                              const EpOptions& o = {});

}  // namespace meshtest::dist
