// tp_layout: the tensor-parallel layout of tensor_parallel.hpp — which mesh axis is TP (the
// tokens are split over the other), a device's place on it, and the placements of activations
// and logits. Local: no communication.
#pragma once

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/tp_shard.hpp"
#include "dist/shard/placement.hpp"

namespace meshtest::dist {

/// The mesh axis of tensor parallelism; the tokens are split over the other axis.
struct TpOptions {
  int tp_axis = 1;
};

/// The mesh axis the tokens are split over: 1 - tp_axis. Throws Error unless tp_axis is 0 or 1.
int token_axis(const TpOptions& o);
/// This device's place on the TP axis of `mesh`.
TpRank tp_rank(const MeshDevice& mesh, const TpOptions& o = {});
/// Placements of activations [T, hidden]: Shard(0) on the token axis, Replicate on the TP axis.
Placements tp_activation_placements(const TpOptions& o = {});
/// Placements of logits [T, vocab]: Shard(0) on the token axis, Shard(1) on the TP axis.
Placements tp_logits_placements(const TpOptions& o = {});

}  // namespace meshtest::dist
