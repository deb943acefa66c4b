// tp_attention (GPU): the gpt-oss attention's projections with tensor parallelism on this rank's
// GPU: qkv column-parallel (a device's q heads, then its k and v heads), out row-parallel.
#pragma once

#include "dist/gpu/parallel/tp_linear.hpp"
#include "src/ops/attention_types.hpp"

namespace meshtest::dist {

/// One device's projection weights, in tp_shard.hpp's layout (H q heads, KV kv heads of d over
/// p devices):
///   qkv_weight [(H/p + 2 KV/p) d, hidden], qkv_bias [(H/p + 2 KV/p) d]: the device's q heads,
///     then its kv heads' k rows, then their v rows;
///   out_weight [hidden, H/p d]: out.weight's columns of the device's q heads; out_bias
///     [hidden] whole, added once (on axis index 0).
struct TpAttentionProjections {
  DeviceTensor qkv_weight, qkv_bias, out_weight, out_bias;
};

/// The projections of a host shard (shard_attention_weights, dist/parallel/tp_shard.hpp) on the
/// current device. Local.
TpAttentionProjections to_device(const AttentionWeights& shard);

/// qkv = x · qkv_weightᵀ + qkv_bias (column-parallel: local).
///   x: [T, hidden]  ->  [T, (H/p + 2 KV/p) d]
DeviceTensor tp_qkv_projection(meshtest::gpu::Blas& blas, const DeviceTensor& x,
                               const TpAttentionProjections& w);

/// out = all_reduce(o · out_weightᵀ (+ out_bias on axis index 0)) (row-parallel: collective
/// over opt.axis, row_parallel_linear's errors).
///   o: [T, H/p d] (the attention output of this device's q heads)  ->  [T, hidden]
DeviceTensor tp_out_projection(const MeshDevice& mesh, meshtest::gpu::Blas& blas,
                               const DeviceTensor& o, const TpAttentionProjections& w,
                               const GpuTpOptions& opt = {});

}  // namespace meshtest::dist
