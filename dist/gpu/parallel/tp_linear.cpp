// tp_linear (GPU): column-parallel = the local GEMM; row-parallel = local checks, the local GEMM
// (bias on index 0) queued, the agreement on the checks, then the all_reduce over the TP axis.
#include "dist/gpu/parallel/tp_linear.hpp"

#include <utility>

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
  return row_parallel_linear_after(mesh, blas, x, weight, bias, opt, {});
}

DeviceTensor row_parallel_linear_after(const MeshDevice& mesh, meshtest::gpu::Blas& blas,
                                       const DeviceTensor& x, const DeviceTensor& weight,
                                       const DeviceTensor* bias, const GpuTpOptions& opt,
                                       std::string earlier_problem) {
  const bool adds_bias = bias != nullptr && mesh.axis_index(opt.axis) == 0;
  std::string problem = std::move(earlier_problem);
  if (problem.empty()) {
    problem = check_message("row_parallel_linear",
                            [&] { meshtest::gpu::check_linear(blas, x, weight, bias); });
  }
  // The GEMM goes first, the agreement while it runs (an axis index is checked by the mesh).
  DeviceTensor partial;
  if (problem.empty()) {
    partial = adds_bias ? meshtest::gpu::linear(blas, x, weight, *bias)
                        : meshtest::gpu::linear(blas, x, weight);
  }
  agree_or_throw(mesh.comm(opt.axis), problem);
  blas.synchronize();  // the CCL reads complete tensors only
  all_reduce_inplace(mesh, partial, {.axis = opt.axis, .numerics = opt.numerics});
  return partial;
}

}  // namespace meshtest::dist
