// tp_linear (GPU): column-parallel = the local GEMM; row-parallel = agreed checks, the local GEMM
// (bias on index 0), then the exact all_reduce over the TP axis.
#include "dist/gpu/tp_linear.hpp"

#include "dist/mesh/agree.hpp"
#include "src/gpu/linear.hpp"

namespace meshtest::dist {

DeviceTensor column_parallel_linear(meshtest::gpu::Blas& blas, const DeviceTensor& x,
                                    const DeviceTensor& weight, const DeviceTensor* bias) {
  return bias != nullptr ? meshtest::gpu::linear(blas, x, weight, *bias)
                         : meshtest::gpu::linear(blas, x, weight);
}

DeviceTensor row_parallel_linear(const MeshDevice& mesh, meshtest::gpu::Blas& blas,
                                 const DeviceTensor& x, const DeviceTensor& weight,
                                 const DeviceTensor* bias, const GpuTpOptions& opt) {
  const bool adds_bias = bias != nullptr && mesh.axis_index(opt.axis) == 0;
  check_and_agree(mesh.comm(opt.axis), "row_parallel_linear",
                  [&] { meshtest::gpu::check_linear(blas, x, weight, bias); });
  DeviceTensor partial = adds_bias ? meshtest::gpu::linear(blas, x, weight, *bias)
                                   : meshtest::gpu::linear(blas, x, weight);
  blas.synchronize();  // the CCL reads complete tensors only
  all_reduce_inplace(mesh, partial, {.axis = opt.axis, .numerics = opt.numerics});
  return partial;
}

}  // namespace meshtest::dist
