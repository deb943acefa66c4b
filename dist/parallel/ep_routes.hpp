// ep_routes: the pieces shared by the expert-parallel forward and backward (internal to
// dist/parallel): where every routed row goes (the counts exchange and the receiver's grouping
// with the capacity), the local experts' forward on the received rows, and row helpers.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/expert_parallel.hpp"
#include "src/core/tensor.hpp"
#include "src/ops/moe.hpp"
#include "src/ops/moe_permute.hpp"

namespace meshtest::dist::ep_detail {

/// The routes of one expert-parallel exchange, known to the sender and the receiver.
struct Routes {
  /// The local slots grouped by destination device, then by expert (placement order:
  /// experts_of[0], experts_of[1], ...), then by token: its "experts" are those positions.
  /// No slot is dropped here: row i of the send buffer is slot send.slots[i].
  Permutation send;
  std::vector<std::int64_t> send_counts;  ///< [D]: rows sent to each device of the EP axis
  std::vector<std::int64_t> recv_counts;  ///< [D]: rows received from each
  /// The received rows (k = 1: slot = row of the receive buffer) grouped by local expert, in
  /// source order within an expert, which is the global token order; the capacity applied.
  Permutation recv;
  std::int64_t dropped = 0;  ///< slots dropped over the EP group (all_reduce; 0 without capacity)
};

/// Collective over the EP axis: the counts exchange (all_to_all of T_local and the per-expert
/// counts, padded to the largest E_local), and with a LowestWeight capacity the rows' routing
/// weights (all_to_all_v). Arguments checked by the caller.
Routes plan_routes(const MeshDevice& mesh, const Routing& r, const EpMlpWeights& w,
                   const MoeParams& p, const EpOptions& o);

/// The receiver's experts on its kept rows x [n, hidden] grouped by recv.offsets:
/// h = x W1ᵀ + b1, a = swiglu(h), y = a W2ᵀ (+ b2 on TP device 0) summed over the TP axis.
struct ExpertActivations {
  Tensor h;  ///< [n, 2I/tp]
  Tensor a;  ///< [n, I/tp]
  Tensor y;  ///< [n, hidden]: with the mlp2 bias, summed over TP
};
ExpertActivations local_experts(const MeshDevice& mesh, const Tensor& x, const Permutation& recv,
                                const EpMlpWeights& w, const MoeParams& p, const EpOptions& o);

/// The kept rows y [recv.rows(), c] back in receive order: [recv.num_tokens, c], a dropped row
/// as zeros (unpermute with unit weights).
Tensor to_receive_order(const Tensor& y, const Permutation& recv);

/// values[slots[i]] for every row i of p: [p.rows(), 1] of values' dtype (values: [T, k]).
Tensor gather_slots(const Tensor& values, const Permutation& p);
/// The inverse: out[slots[i]] = column[i] for every row i of p, zeros elsewhere. -> [T, k]
Tensor scatter_slots(const Tensor& column, const Permutation& p);

/// Throws Error (locally; the caller agrees it over the mesh) unless `w` fits this mesh (the
/// placement complete and over the EP axis, the weights of this EP device), tokens of `hidden`
/// and `dtype`, and `p` (k in [1, E]), and o's capacity factor is finite and >= 0.
void check_ep_weights(std::string_view op, const MeshDevice& mesh, const EpMlpWeights& w,
                      const MoeParams& p, const EpOptions& o, std::int64_t hidden, DType dtype);
/// Throws Error unless the routing r fits the tokens t [T, hidden] (T tokens, k =
/// p.experts_per_token, weights [T, k] of t's dtype, expert ids in [0, num_experts)).
void check_ep_tokens(std::string_view op, const Tensor& t, const Routing& r,
                     std::int64_t num_experts, const MoeParams& p);

}  // namespace meshtest::dist::ep_detail
