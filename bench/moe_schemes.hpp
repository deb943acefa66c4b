// moe_schemes: what meshtest-bench moe sets beside the expert-parallel block — random gpt-oss MLP
// weights any device generates by slice, the all_gather-everything MoE block it is compared
// with, and the rows each scheme's exchanges move, counted from the routing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/expert_parallel.hpp"
#include "dist/parallel/tp_shard.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/ops/moe/balance.hpp"

namespace meshtest::bench {

/// Layer 0's MLP weights of `c` (checkpoint names block.0.mlp.*), f32, uniform so that the gate
/// logits, the experts' products and the output are of unit order: norm.scale in [0.5, 1.5],
/// gate and mlp1 weights in ±sqrt(3 / hidden), mlp2 weights in ±sqrt(3 / intermediate), biases
/// in ±0.1. Element i of a tensor depends only on (seed, the tensor's name, i) (generate_slice),
/// so a device builds only the slices it holds and every layout sees the same model.
/// Throws Error for a name that is not one of those seven.
dist::WeightSource random_mlp_source(const GptOssConfig& c, std::uint64_t seed);

/// The MoE MLP block with the all_gather-everything exchange on the EP layout of `w` (tokens
/// split over o.ep_axis by the array_split rule, experts placed by w.placement, their units
/// split over the TP axis): t = rms_norm(x); every device all_gathers t over the EP axis,
/// routes all T tokens (the router is replicated), runs its own experts on the rows routed to
/// them (the grouped GEMMs of ep_detail::local_experts, as ep_moe), weights and sums them into
/// [T, hidden] (zero rows for tokens none of its experts serves), reduce_scatters that over the
/// EP axis back to its own tokens and sums it over the TP axis (all_reduce, as ep_moe sums its
/// rows after the weights); out = x + that.
///   x: [T_local, hidden] f32 -> [T_local, hidden]. Collective over the whole mesh. Without a
/// capacity it equals ep_mlp_block (to f32 rounding). No checks beyond those of its ops.
Tensor all_gather_mlp_block(const dist::MeshDevice& mesh, const Tensor& x,
                            const dist::EpMlpWeights& w, const MoeParams& p,
                            const dist::EpOptions& o);

/// What one EP device's exchanges carry, in rows of `hidden` values (the row exchanges) and in
/// f64 values (EP's side lists). Every row scheme below sends as many rows as it receives, so
/// one figure per scheme is each way.
struct DeviceTraffic {
  std::int64_t tokens = 0;            ///< its tokens (the array_split share of T)
  std::int64_t experts = 0;           ///< its experts
  std::int64_t pairs = 0;             ///< the (token, expert) pairs its experts compute
  std::vector<std::int64_t> to;       ///< [D]: rows its dispatch sends to each device, itself too
  std::vector<std::int64_t> from;     ///< [D]: rows its dispatch receives from each device
  std::vector<std::int64_t> side_to;  ///< [D]: side-list values it sends to each device
  std::int64_t ep_rows = 0;      ///< EP: one row per (token, distinct other device of its experts)
                                 ///< in the dispatch, and one back in the combine
  std::int64_t side_values = 0;  ///< EP side-list values sent + received, itself excluded
  std::int64_t min_rows = 0;     ///< the minimum: one row per (token, distinct other device of
                                 ///< its experts) in the dispatch, and one back in the combine
  std::int64_t ag_rows = 0;      ///< all_gather-everything: (D − 1)·T_d + T − T_d (all_gather
                                 ///< and reduce_scatter, direct algorithm)
  std::int64_t messages = 0;     ///< non-empty row messages the EP dispatch and combine send
};

/// Per EP device d, from the experts of all T tokens (experts: [T * k], token order, tokens
/// split over the D = placement.num_devices devices by the array_split rule) and the placement.
/// Throws Error for k < 1, a length that is not a multiple of k or an expert outside [0, E).
std::vector<DeviceTraffic> ep_traffic(std::span<const std::int64_t> experts, std::int64_t k,
                                      const ExpertPlacement& placement);

}  // namespace meshtest::bench
