// tp_attention (GPU): the projections' weights on the device and the two TP linears.
#include "dist/gpu/parallel/tp_attention.hpp"

namespace meshtest::dist {

TpAttentionProjections to_device(const AttentionWeights& shard) {
  return {.qkv_weight = DeviceTensor::from_host(shard.qkv_weight),
          .qkv_bias = DeviceTensor::from_host(shard.qkv_bias),
          .out_weight = DeviceTensor::from_host(shard.out_weight),
          .out_bias = DeviceTensor::from_host(shard.out_bias)};
}

DeviceTensor tp_qkv_projection(meshtest::gpu::Blas& blas, const DeviceTensor& x,
                               const TpAttentionProjections& w) {
  return column_parallel_linear(blas, x, w.qkv_weight, &w.qkv_bias);
}

DeviceTensor tp_out_projection(const MeshDevice& mesh, meshtest::gpu::Blas& blas,
                               const DeviceTensor& o, const TpAttentionProjections& w,
                               const GpuTpOptions& opt) {
  return row_parallel_linear(mesh, blas, o, w.out_weight, &w.out_bias, opt);
}

}  // namespace meshtest::dist
