// ep_layout: the expert-parallel layout of expert_parallel.hpp — its options (the experts' mesh
// axis, the capacity), the MLP weights an EP device holds, and a device's places on the EP and
// TP axes. Local: no communication.
#pragma once

#include <optional>

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/tp_shard.hpp"
#include "dist/shard/placement.hpp"
#include "src/ops/moe/balance.hpp"
#include "src/ops/moe/permute.hpp"
#include "src/ops/moe/types.hpp"

namespace meshtest::dist {

/// Options of the expert-parallel block.
struct EpOptions {
  int ep_axis = 0;  ///< the mesh axis of experts (and tokens); TP runs on 1 − ep_axis
  /// Capacity factor (expert_capacity over the global token count); none: no token is dropped.
  std::optional<double> capacity_factor = std::nullopt;
  DropPolicy drop_policy = DropPolicy::TokenOrder;
};

/// The TP axis of `o`: 1 − ep_axis. Throws Error unless ep_axis is 0 or 1 (the same on every
/// device: it is an argument, checked before any communication).
int ep_tp_axis(const EpOptions& o);
/// This device's place on the EP axis: {size, index} (TpRank's fields, for the EP axis).
TpRank ep_rank(const MeshDevice& mesh, const EpOptions& o = {});
/// This device's place on the TP axis (1 − ep_axis); {1, 0} on a 1-D EP mesh.
TpRank ep_tp_rank(const MeshDevice& mesh, const EpOptions& o = {});
/// Placements of activations [T, hidden]: Shard(0) on the EP axis, Replicate on the TP axis
/// (tp_activation_placements with tp_axis = 1 − ep_axis).
Placements ep_activation_placements(const EpOptions& o = {});

/// The MLP weights an EP device holds: the replicated router (mlp.norm_scale [hidden],
/// mlp.gate_weight [E, hidden], mlp.gate_bias [E]) and its experts placement.experts_of[device]
/// (ascending) with the TP slice of their units, as tp_shard slices them:
/// mlp.mlp1_weight [E_local, 2I/tp, hidden], mlp.mlp1_bias [E_local, 2I/tp],
/// mlp.mlp2_weight [E_local, hidden, I/tp], mlp.mlp2_bias [E_local, hidden] (whole). A device
/// with no experts holds them with E_local = 0.
struct EpMlpWeights {
  ExpertPlacement placement;  ///< the same on every device
  int device = 0;             ///< this device's index on the EP axis
  MlpWeights mlp;
};

}  // namespace meshtest::dist
