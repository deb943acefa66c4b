// tp_experts (GPU): the local experts op on this device's units, one agreement, the all_reduce.
#include "dist/gpu/parallel/tp_experts.hpp"

#include <string>

#include "dist/gpu/ccl/ccl.hpp"
#include "dist/mesh/agree.hpp"

namespace meshtest::dist {

DeviceTensor tp_experts(const MeshDevice& mesh, meshtest::gpu::Blas& blas, const DeviceTensor& t,
                        const GpuExpertShardRefs& w, const MoeParams& p, const GpuTpOptions& o,
                        meshtest::gpu::Segments segments) {
  // The axis index is checked by the mesh (an Error on every device alike).
  const bool bias_here = mesh.axis_index(o.axis) == 0;
  const DeviceTensor no_bias;
  DeviceTensor partial;
  // The local op is queued (and its own checks made) before the devices agree.
  const std::string problem = check_message("tp_experts", [&] {
    partial =
        meshtest::gpu::experts(blas, t, w.gate_weight, w.gate_bias, w.mlp1_weight, w.mlp1_bias,
                               w.mlp2_weight, bias_here ? w.mlp2_bias : no_bias, p, segments);
  });
  agree_or_throw(mesh.comm(o.axis), problem);
  blas.synchronize();  // the collective takes a complete partial (a capture keeps one order)
  all_reduce_inplace(mesh, partial, {.axis = o.axis, .numerics = o.numerics});
  return partial;
}

}  // namespace meshtest::dist
