// experts_tp: the fused experts op (src/ops/moe/experts.hpp) with tensor parallelism — the experts'
// intermediate units split over a mesh axis, the partial outputs summed by one all_reduce.
//
// Layout (that of tp_mlp_block, tensor_parallel.hpp): on the TP axis of p devices, device i holds
// the units [i I/p, (i+1) I/p) of every expert — mlp1_weight / mlp1_bias rows [2i I/p,
// 2(i+1) I/p) (whole glu/linear pairs) and mlp2_weight columns [i I/p, (i+1) I/p), as
// shard_mlp_weights (tp_shard.hpp) gives them — and the router (gate.weight, gate.bias) and
// mlp2_bias whole. The op itself needs only that the devices' units partition the I units, each
// device holding whole pairs: an uneven split (array_split of the units, even a device with no
// unit) gives the same sum. The tokens may be split over the other axis (Shard(0)); each device
// routes its own tokens.
#pragma once

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/tp_layout.hpp"
#include "src/core/tensor.hpp"
#include "src/ops/moe/moe.hpp"

namespace meshtest::dist {

/// Collective over the TP axis (every device of the mesh calls it with its own shards, and runs
/// the same CCLs in the same order):
///   partial = experts(t, gate, mlp1 shard, mlp2 shard, mlp2_bias on TP device 0 only)
///   out = all_reduce(partial, TP axis)
///   t: [T_local, hidden] (the normed activation: placements tp_activation_placements(o)),
///   w: this device's shard_mlp_weights (w.norm_scale is not read)  ->  [T_local, hidden],
///   placed as t.
/// Every device of a TP group routes the same tokens with the same replicated gate, so they
/// agree on the experts; only [T_local, hidden] crosses the axis (tp_mlp_block all_reduces the
/// [T_local, k, hidden] expert outputs). The mlp2 bias joins once, in device 0's partial, so on a
/// TP axis of one device the result is experts' bit for bit. f32 and f64 equal the single-device
/// op to rounding; bf16 rounds each device's partial to bf16 and the all_reduce sums the p
/// partials in f32 and rounds once (the single device rounds once after all k experts).
/// Throws the same Error on every device of the mesh, before any communication, for a bad
/// tp_axis, t not [T_local, hidden], k outside [1, E], or a shard whose shape or dtype does not
/// fit t or the others (check_moe_weights, mlp2_bias required on every device). Shards that do
/// not partition the units (overlapping or missing ones) cannot be detected and give a wrong sum.
Tensor tp_experts(const MeshDevice& mesh, const Tensor& t, const MlpWeights& w, const MoeParams& p,
                  const TpOptions& o = {});

/// The router and expert shards that tp_experts reads, by reference: an MlpWeights' tensors, or
/// tensors held elsewhere without a copy (a perf::Trace's inputs, so that a capture records a
/// step on buffers the trace owns).
struct ExpertWeightRefs {
  const Tensor& gate_weight;
  const Tensor& gate_bias;
  const Tensor& mlp1_weight;
  const Tensor& mlp1_bias;
  const Tensor& mlp2_weight;
  const Tensor& mlp2_bias;
};

/// tp_experts on weights by reference (the same op, checks and errors).
Tensor tp_experts(const MeshDevice& mesh, const Tensor& t, const ExpertWeightRefs& w,
                  const MoeParams& p, const TpOptions& o = {});

}  // namespace meshtest::dist
