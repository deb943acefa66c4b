// moe (GPU): the MoE router, its load statistics and the token permutation on DeviceTensors, each
// with the contract of the CPU op of the same name (src/ops/moe/gating.hpp, balance.hpp,
// permute.hpp) and checked against it (tests/gpu/test_gpu_moe.cpp):
//   - the chosen experts, the counts, the permutation, the permuted rows and the unpermuted sums
//     are the CPU op's bits (fixed orders, every step rounded as on the host, no FMA);
//   - the router weights, probabilities and the auxiliary loss differ from the CPU's only by the
//     GPU's exp (2 ulp in f32) and sums taken in another order: within the error model of
//     docs/tolerances.md.
// Every op is queued on `stream` (of the inputs' device); the ones that must see their result to
// raise an Error (a NaN logit, an expert id out of range) synchronize it. The grouped GEMM and the
// experts op: experts.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "src/gpu/device_tensor.hpp"
#include "src/ops/moe/gating.hpp"
#include "src/ops/moe/permute.hpp"
#include "src/ops/moe/types.hpp"

namespace meshtest::gpu {

/// The router's choice for every token, on the GPU.
struct DeviceRouting {
  std::int64_t num_tokens = 0;
  std::int64_t k = 0;
  DeviceTensor experts;  ///< i64 [T, k]: token t's experts, highest logit first
  DeviceTensor weights;  ///< [T, k], the logits' dtype
  /// The same routing as the CPU's Routing (copies back; the stream must have finished).
  [[nodiscard]] Routing to_host() const;
};

/// gate (src/ops/moe/gating.hpp) on the GPU: the k experts of the largest logits of each row,
/// equal logits by expert id (lower first), weighed by `o.order`.
///   logits: [T, E] (f32, f64 or bf16) -> DeviceRouting{T, k, experts [T, k], weights [T, k]}
/// T = 0 is legal. Throws Error for logits that are not a [T, E] of those dtypes, k outside
/// [1, E], or a NaN logit (named by token and expert; the stream is synchronized to see it).
DeviceRouting gate(const DeviceTensor& logits, std::int64_t k, cudaStream_t stream,
                   const GatingOptions& o = {});

/// router_probabilities on the GPU: the softmax of every row, f32 (f64 for f64 logits).
/// Errors as gate's (a NaN is seen after synchronizing the stream).
DeviceTensor router_probabilities(const DeviceTensor& logits, cudaStream_t stream);

/// expert_load on the GPU: the slots routed to each expert, i64 [E]. Throws Error for E < 1
/// or an expert id outside [0, E) (named with its token; the stream is synchronized to see it).
DeviceTensor expert_load(const DeviceRouting& r, std::int64_t num_experts, cudaStream_t stream);

/// load_balancing_loss on the GPU's counts and column means of `probs` [T, E] (f32 or f64, as
/// router_probabilities gives): E · Σ_e f_e · P_e in f64; 0 for T = 0. Synchronizes the stream.
double load_balancing_loss(const DeviceTensor& probs, const DeviceRouting& r, cudaStream_t stream);

/// The routed slots grouped by expert on the GPU (Permutation's layout: slot s = t k + j; expert
/// e's rows are [offsets[e], offsets[e + 1]), its slots ascending); the slots apply_capacity
/// dropped have no row.
struct DevicePermutation {
  std::int64_t num_tokens = 0;
  std::int64_t k = 0;
  std::int64_t num_experts = 0;
  DeviceTensor slots;        ///< i64 [rows]
  DeviceTensor offsets;      ///< i64 [E + 1]
  DeviceTensor row_of_slot;  ///< i64 [T k]: the row holding each slot, -1 where dropped
  [[nodiscard]] std::int64_t rows() const { return slots.numel(); }
  /// The same permutation as the CPU's (copies back; the stream must have finished).
  [[nodiscard]] Permutation to_host() const;
};

/// make_permutation (v2, top-k) on the GPU. Throws Error as expert_load does.
DevicePermutation make_permutation(const DeviceRouting& r, std::int64_t num_experts,
                                   cudaStream_t stream);

/// permute_top1 (v1, one expert per token) on the GPU: the tokens grouped by expert_of (i64
/// [T]), ascending within one; the CPU op's slots and offsets (a v1 permutation is v2's with
/// k = 1). Throws Error for an expert id outside [0, num_experts) (named with its token; the
/// stream is synchronized to see it) or expert_of not an i64 [T].
DevicePermutation permute_top1(const DeviceTensor& expert_of, std::int64_t num_experts,
                               cudaStream_t stream);

/// A host permutation (a routing grouped on the host, e.g. expert parallelism's routes) on the
/// current device: its slots, offsets and the row of every slot (-1 for a dropped one), for
/// permute and unpermute here. Complete when it returns.
DevicePermutation to_device(const Permutation& p);

/// apply_capacity (src/ops/moe/permute.hpp) on the GPU: drops from every expert of p the slots
/// over `capacity` by `policy` (LowestWeight reads weights [T, k], f32, f64 or bf16: the
/// `capacity` slots of largest weight stay, equal weights by lower slot); the kept slots stay in
/// slot order, and p's slots, offsets and row_of_slot are replaced (a dropped slot's row is -1).
/// Returns the number dropped by this call. The result is the CPU op's, slot for slot.
/// Synchronizes the stream. Throws Error for a negative capacity, LowestWeight without weights
/// of shape [T, k], or a NaN weight (named by token and slot).
std::int64_t apply_capacity(DevicePermutation& p, std::int64_t capacity, cudaStream_t stream,
                            DropPolicy policy = DropPolicy::TokenOrder,
                            const DeviceTensor* weights = nullptr);

/// permute: out[i] = x[slots[i] / k].   x: [T, h] (any dtype) -> [rows, h], a copy.
/// Throws Error when x is not [T, h] for the permutation's T.
DeviceTensor permute(const DeviceTensor& x, const DevicePermutation& p, cudaStream_t stream);

/// unpermute: out[t] = Σ_j weights[t, j] · y[row of slot t k + j] over j ascending from 0, a
/// dropped slot adding nothing, in f32 (f64 for f64) and rounded once: the CPU op's bits.
///   y: [rows, h], weights: [T, k] (y's dtype: f32, f64 or bf16) -> [T, h]
DeviceTensor unpermute(const DeviceTensor& y, const DevicePermutation& p,
                       const DeviceTensor& weights, cudaStream_t stream);

}  // namespace meshtest::gpu
