// ep_routes: the pieces shared by the expert-parallel forward and backward (internal to
// dist/parallel and its GPU twin, dist/gpu/parallel/ep_moe): where every token row goes (once per
// EP device holding one of its experts, with that device's (local expert, routing weight) pairs in
// a side list), the receiver's grouping of the pairs by expert with the capacity, the local
// experts' forward on the pairs, and row helpers.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/ep_layout.hpp"
#include "src/core/tensor.hpp"
#include "src/ops/moe/moe.hpp"
#include "src/ops/moe/permute.hpp"

namespace meshtest::dist::ep_detail {

/// The routes of one expert-parallel exchange, known to the sender and the receiver. A "row"
/// is one token sent to one EP device (its own included: that block is a local copy); a
/// "pair" is one (row, expert of the token on that device), i.e. one routed slot.
struct Routes {
  /// The sender's rows as a permutation with k = D: slot t·D + d is token t's row for EP device
  /// d, grouped by device (ascending), tokens ascending within one; the (token, device) slots
  /// without a row are in `dropped`, so unpermute(back, send, ones [T, D]) sums each token's
  /// returned rows over the devices in ascending order. Row i of the dispatch buffer is token
  /// send.slots[i] / D.
  Permutation send;
  /// [send.rows() · k]: row i's pairs as routing slots t·k + j, in the order of its side list
  /// (j ascending, the routing order), −1 past its last pair.
  std::vector<std::int64_t> send_pairs;
  std::vector<std::int64_t> send_counts;  ///< [D]: rows sent to each device (itself included)
  std::vector<std::int64_t> recv_counts;  ///< [D]: rows received from each
  /// The received pairs: slot i·k + q is pair q of received row i (rows by source device, then
  /// token: the global token order), grouped by local expert, slots ascending within one, the
  /// capacity applied; the slots past a row's last pair are in `dropped` with the capacity's.
  Permutation recv;
  Tensor recv_weights;       ///< [N, k], the tokens' dtype: each pair's routing weight, 0 past
  std::int64_t dropped = 0;  ///< pairs (slots) dropped by the capacity over the EP group
};

/// Collective over the EP axis: one all_to_all_v of the side lists (f64; to each device d:
/// T_local, the row count n_d, then per row its pair count c, its c local expert indices and
/// their c routing weights — integers and f32/bf16/f64 weights are exact in f64), then, with a
/// capacity, apply_capacity on the receiver's pairs (expert_capacity of the EP group's tokens)
/// and an all_reduce of the dropped count. Arguments checked by the caller.
/// `placement` and `device` (this device's index on the EP axis) are the weights' (EpMlpWeights
/// on the host, or their copy on a GPU rank: dist/gpu/parallel/ep_moe.hpp).
Routes plan_routes(const MeshDevice& mesh, const Routing& r, const ExpertPlacement& placement,
                   int device, const MoeParams& p, const EpOptions& o);

/// Side values (f64) a device sends to one device for `rows` rows of `pairs` pairs in all:
/// 2 + rows + 2 · pairs (the bench counts its bytes with this).
std::int64_t side_values(std::int64_t rows, std::int64_t pairs);

/// The receiver's experts on its kept pairs x [n, hidden] grouped by recv.offsets, this TP
/// device's units only: h = x W1ᵀ + b1, a = swiglu(h), y = a W2ᵀ (+ b2 on TP device 0, so the
/// bias joins the TP sum once). y is a partial sum over the TP axis: the caller sums what it
/// derives from y linearly (sum_over_tp). No communication.
struct ExpertActivations {
  Tensor h;  ///< [n, 2I/tp]
  Tensor a;  ///< [n, I/tp]
  Tensor y;  ///< [n, hidden]: this TP device's part (with the mlp2 bias on TP device 0)
};
ExpertActivations local_experts(const MeshDevice& mesh, const Tensor& x, const Permutation& recv,
                                const EpMlpWeights& w, const MoeParams& p, const EpOptions& o);

/// Collective over the TP axis (1 − o.ep_axis): all_reduce of x in place; nothing on TP 1.
void sum_over_tp(const MeshDevice& mesh, Tensor& x, const EpOptions& o);

/// A [shape] tensor of `dtype` filled with ones (unpermute's unit weights).
Tensor ones(Shape shape, DType dtype);

/// values[slots[i]] for every row i of p: [p.rows(), 1] of values' dtype (values: [T, k]).
Tensor gather_slots(const Tensor& values, const Permutation& p);
/// The inverse: out[to[i]] = values[i] (flat) for every i with to[i] >= 0, zeros elsewhere.
///   values: to.size() elements  ->  [shape] of values' dtype
Tensor scatter_values(const Tensor& values, std::span<const std::int64_t> to, Shape shape);

/// Throws Error (locally; the caller agrees it over the mesh) unless the placement is complete
/// and over the EP axis of this mesh, `device` is this device's EP index, `p`'s k is in [1, E],
/// o's capacity factor is finite and >= 0 and its drop policy one of the two.
void check_ep_layout(std::string_view op, const MeshDevice& mesh, const ExpertPlacement& placement,
                     int device, const MoeParams& p, const EpOptions& o);
/// check_ep_layout, and `w`'s tensors of the shapes of its experts for tokens of `hidden` and
/// `dtype`.
void check_ep_weights(std::string_view op, const MeshDevice& mesh, const EpMlpWeights& w,
                      const MoeParams& p, const EpOptions& o, std::int64_t hidden, DType dtype);
/// Throws Error unless the routing r fits `tokens` tokens of `dtype` (k = p.experts_per_token,
/// weights [T, k] of that dtype, expert ids in [0, num_experts)).
void check_ep_tokens(std::string_view op, std::int64_t tokens, DType dtype, const Routing& r,
                     std::int64_t num_experts, const MoeParams& p);

}  // namespace meshtest::dist::ep_detail
