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
// The block: t = rms_norm(x); r = top-k router; rows grouped by destination device and expert;
// per-expert counts exchanged first (all_to_all on the EP axis), then the token rows
// (all_to_all_v); the receiver optionally applies the capacity (in global token order, so it
// equals the single-device capacity) and runs its experts as grouped GEMMs; the partial mlp2
// products are summed over the TP axis (all_reduce); the rows go back by the reverse
// all_to_all_v; the sender adds each expert's mlp2 bias, weights and sums them (unpermute);
// out = x + that. A device holding no experts, or no tokens, still joins every exchange.
//
// Every function is collective over the whole mesh: all devices call it with the same
// arguments apart from their own shards, and run the same CCLs in the same order. Bad input
// throws the same meshtest::Error on every device before any communication.
#pragma once

#include <cstdint>
#include <optional>

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/tp_shard.hpp"
#include "src/core/tensor.hpp"
#include "src/ops/moe.hpp"
#include "src/ops/moe_balance.hpp"
#include "src/ops/moe_permute.hpp"

namespace meshtest::dist {

/// How experts are placed on the EP axis.
enum class ExpertAssignment { Contiguous, Balanced };

/// Options of the expert-parallel block.
struct EpOptions {
  int ep_axis = 0;  ///< the mesh axis of experts (and tokens); TP runs on 1 − ep_axis
  /// Capacity factor (expert_capacity over the global token count); none: no token is dropped.
  std::optional<double> capacity_factor = std::nullopt;
  DropPolicy drop_policy = DropPolicy::TokenOrder;
};
