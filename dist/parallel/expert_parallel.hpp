// expert_parallel: the gpt-oss MoE MLP block with its experts placed on the devices of one mesh
// axis (expert parallelism, EP) and their intermediate units split over the other (TP).
//
// Layout on an R x C mesh with EP on axis A (EpOptions::ep_axis) and TP on axis 1 − A:
//   - the tokens are split over the EP axis (array_split, Shard(0)) and replicated over TP, as
//     tensor_parallel.hpp places activations with tp_axis = 1 − A;
//   - expert e lives on EP device placement.device_of[e] (contiguous by the array_split rule, or
//     balanced by load); its mlp1/mlp2 weights are split over the TP axis as tp_shard does, so a
//     device holds [E_local, 2I/tp, hidden] and [E_local, hidden, I/tp];
//   - the router (norm, gate) is replicated and runs on the local tokens.
// The block: t = rms_norm(x); r = top-k router; each local token goes ONCE to every EP device
// holding one of its experts (its own device too, as a local copy), not once per routed slot:
//   1. side exchange (all_to_all_v on the EP axis, f64): to each device T_local, the row count,
//      and per row its pairs — the token's experts on that device (their local indices) and
//      their routing weights, in routing order; 2 + rows + 2·pairs values per device;
//   2. dispatch (all_to_all_v): the token rows, grouped by destination, tokens ascending;
//   3. the receiver expands its rows into (row, local expert) pairs grouped by expert in
//      global token order, applies the capacity there (so it equals the single-device
//      apply_capacity with expert_capacity(T_global, ...)), runs its experts as grouped GEMMs
//      (this TP device's units; TP device 0 adds the mlp2 bias, so it is weighted with its
//      pair and a dropped pair, never computed, adds nothing), multiplies each pair by its
//      routing weight, sums the pairs of a row and sums that over the TP axis (all_reduce);
//   4. combine (the reverse all_to_all_v): one row back per received token; the sender sums a
//      token's returned rows over the devices in ascending order; out = x + that.
// Summation order: moe_combine sums a token's k weighted expert outputs in routing order; here
// the pairs of one device are summed in routing order, then the devices' sums in ascending
// device order (and the TP partials after the weights). The result equals moe_combine to
// rounding, not bit for bit (f32 within 1e-5, f64 within 1e-12 relative in the tests; bf16
// rounds each device's sum once more). A device holding no experts, or no tokens, still joins
// every exchange.
//
// Every function is collective over the whole mesh: all devices call it with the same
// arguments apart from their own shards, and run the same CCLs in the same order. Bad input
// throws the same meshtest::Error on every device before any communication. The options, the
// weights a device holds and its axes (EpOptions, EpMlpWeights, ep_rank, ...) are in
// ep_layout.hpp (included here).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/ep_layout.hpp"
#include "dist/parallel/tp_shard.hpp"
#include "dist/shard/placement.hpp"
#include "src/core/tensor.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/ops/moe/balance.hpp"
#include "src/ops/moe/grad.hpp"
#include "src/ops/moe/moe.hpp"
#include "src/ops/moe/permute.hpp"

namespace meshtest::dist {

/// How experts are placed on the EP axis.
enum class ExpertAssignment { Contiguous, Balanced };

/// The experts of `num_experts` placed on `num_devices` devices: contiguous_placement, or
/// balanced_placement of `load` ([E] slots per expert, e.g. global_expert_load). Throws Error
/// for E < 1, D < 1, or a Balanced assignment whose load does not have E entries.
ExpertPlacement place_experts(ExpertAssignment a, std::int64_t num_experts, int num_devices,
                              std::span<const std::int64_t> load = {});

/// Collective over the EP axis: the slots routed to each expert by the tokens of every device
/// of this device's EP group (expert_load of the local routing, summed over the EP axis), so
/// every device computes the same balanced placement. r: the routing of the local tokens.
///   -> [E]. Throws Error (on every device) for an expert id outside [0, E).
std::vector<std::int64_t> global_expert_load(const MeshDevice& mesh, const Routing& r,
                                             std::int64_t num_experts, const EpOptions& o = {});

/// This device's EP weights of layer `layer` from a WeightSource (in-memory full weights or a
/// checkpoint): each local expert is taken by src.slice along dim 0 (one expert at a time, so
/// a checkpoint reader holds one whole expert at most), then cut by shard_mlp_weights' TP rule.
/// Throws Error for a placement that is inconsistent (check_placement) or not of
/// c.num_experts experts, an ep_device outside [0, placement.num_devices), or an intermediate
/// size that tp.size does not divide.
EpMlpWeights shard_ep_mlp_weights(const WeightSource& src, const GptOssConfig& c,
                                  std::int64_t layer, const ExpertPlacement& placement,
                                  int ep_device, TpRank tp);

/// The routed experts and their combine, on the mesh. Collective over the whole mesh.
struct EpMoeResult {
  Tensor out;                ///< [T_local, hidden]: Σ_j w[t, j] (y[t, j] + mlp2_bias[e])
  std::int64_t dropped = 0;  ///< slots dropped by the capacity over the EP group (0 without)
  /// [D]: token rows this device's dispatch sent to each EP device (itself included: a local
  /// copy): one per local token and distinct device holding one of its experts.
  std::vector<std::int64_t> rows_sent;
  /// [D]: token rows it received from each EP device (its combine returns as many).
  std::vector<std::int64_t> rows_received;
};

/// out = moe_combine(moe_experts(t, r, ...), r, mlp2_bias) for the local tokens, with the
/// experts on their EP devices (the steps of the file comment): the side lists by all_to_all_v
/// on the EP axis, one row per token and device by all_to_all_v; the receiver keeps at most
/// expert_capacity(T_global, k, E, factor) pairs of each expert when o.capacity_factor is set
/// (o.drop_policy over the pairs in global token order, T_global the tokens of the EP group: it
/// equals apply_capacity on the single device's permutation), runs them as grouped GEMMs
/// (mlp1 with bias, swiglu, mlp2 with its bias on TP device 0), weights and sums each row's
/// pairs, sums over the TP axis (all_reduce), and returns one row per received token by the
/// reverse all_to_all_v; the sender sums each token's rows (devices ascending). A dropped slot
/// adds nothing (no bias either), so a token whose slots all dropped gets zeros (the block's
/// residual remains).
///   t: [T_local, hidden] (the normed tokens), r: their routing (r.k = p.experts_per_token),
///   w: shard_ep_mlp_weights(...); f32, f64 or bf16, all of t's dtype.
/// Throws the same Error on every device, before any communication, for a bad ep_axis, a
/// placement missing an expert or not of this mesh's EP size, weights or routing whose shapes
/// or dtypes do not fit, an expert id outside [0, E), k outside [1, E], or a negative or
/// non-finite capacity factor.
EpMoeResult ep_moe(const MeshDevice& mesh, const Tensor& t, const Routing& r, const EpMlpWeights& w,
                   const MoeParams& p, const EpOptions& o = {});

/// The gpt-oss MLP block, expert-parallel: t = rms_norm(x); r = route_top_k(linear(t, gate), k)
/// on the local tokens (the router is replicated); out = x + ep_moe(t, r).out.
///   x: [T_local, hidden] -> [T_local, hidden], placed ep_activation_placements(o).
/// Without a capacity it equals mlp_block on the whole x (f32: to rounding). Errors: ep_moe's.
Tensor ep_mlp_block(const MeshDevice& mesh, const Tensor& x, const EpMlpWeights& w,
                    const MoeParams& p, const EpOptions& o = {});

/// The backward of ep_moe for the local tokens through the same routes: the side exchange,
/// then each token's row once per device with its grad_out row beside it; the receiver
/// recomputes its experts' forward on the pairs (this TP device's units), gets each pair's
/// grad at the expert output (weight · grad_out) and its routing-weight grad (grad_out · y,
/// a TP partial), runs grouped_gemm_backward and swiglu_backward, sums each row's grad of x over
/// its pairs, sums [grad of x, the row's k weight grads] over the TP axis (one all_reduce) and
/// returns one row per received token by the reverse all_to_all_v; the sender sums a token's
/// grad-of-x rows over the devices (ascending) and places the weight grads at their slots.
/// Dropped slots get zero grads. Returns (MoeGrads fields):
///   t [T_local, hidden], weights [T_local, k]: the local tokens' rows of moe_backward's;
///   mlp1_weight [E_local, 2I/tp, hidden], mlp1_bias [E_local, 2I/tp], mlp2_weight
///   [E_local, hidden, I/tp]: the local experts' TP slices of moe_backward's; mlp2_bias
///   [E_local, hidden]: the local experts' rows (whole on every TP device).
/// f32 or f64. grad_out: [T_local, hidden] of t's dtype. Errors: ep_moe's, and a grad_out of
/// another shape or dtype, or bf16.
MoeGrads ep_moe_backward(const MeshDevice& mesh, const Tensor& t, const Routing& r,
                         const EpMlpWeights& w, const Tensor& grad_out, const MoeParams& p,
                         const EpOptions& o = {});

}  // namespace meshtest::dist
