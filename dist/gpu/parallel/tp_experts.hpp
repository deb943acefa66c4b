// tp_experts (GPU): the fused experts op (src/gpu/experts.hpp) with tensor parallelism on this
// rank's GPU — the experts' intermediate units split over a mesh axis, the partial outputs summed
// by one all_reduce over the mesh's NCCL axis. The GPU form of dist/parallel/experts_tp.hpp, with
// its layout: on the TP axis of p devices, device i holds the units [i I/p, (i+1) I/p) of every
// expert (mlp1_weight / mlp1_bias rows of whole glu/linear pairs, mlp2_weight columns, as
// shard_mlp_weights gives them) and the router (gate.weight, gate.bias) and mlp2_bias whole.
#pragma once

#include "dist/gpu/parallel/tp_linear.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/experts.hpp"
#include "src/ops/moe/types.hpp"

namespace meshtest::dist {

/// This device's router and expert shards on its GPU, by reference (the caller keeps them).
struct GpuExpertShardRefs {
  const DeviceTensor& gate_weight;  ///< [E, hidden], whole
  const DeviceTensor& gate_bias;    ///< [E], whole
  const DeviceTensor& mlp1_weight;  ///< [E, 2 I_local, hidden]
  const DeviceTensor& mlp1_bias;    ///< [E, 2 I_local]
  const DeviceTensor& mlp2_weight;  ///< [E, hidden, I_local]
  const DeviceTensor& mlp2_bias;    ///< [E, hidden], whole (added by the axis's first device)
};

/// Collective over o.axis (every device of the axis calls it with its own shards):
///   partial = gpu::experts(t, router, mlp1 shard, mlp2 shard, mlp2_bias on the axis's device 0
///             only, p, segments)
///   out = all_reduce(partial, o.axis, o.numerics)
///   t: [T, hidden] (the same on every device of the axis)  ->  [T, hidden] (likewise)
/// Every device routes the same tokens with the same router on the same kind of GPU, so they
/// choose the same experts; only [T, hidden] crosses the axis. The exact all_reduce (the
/// default) sums the p partials as the CPU path does: bf16 rounds each device's partial, then
/// sums them in f32 and rounds once, as tp_experts on CPU ranks. With Segments::device nothing
/// reads the device on the host, so the op can be captured in a CUDA graph (gpu::Graph) and
/// replayed on new tokens. Bad input on any device (gpu::experts's errors: shapes, dtypes, k,
/// a NaN logit) is the same Error on every device of the axis, before the all_reduce.
DeviceTensor tp_experts(const MeshDevice& mesh, meshtest::gpu::Blas& blas, const DeviceTensor& t,
                        const GpuExpertShardRefs& w, const MoeParams& p, const GpuTpOptions& o = {},
                        meshtest::gpu::Segments segments = meshtest::gpu::Segments::host);

}  // namespace meshtest::dist
