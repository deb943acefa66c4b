// The experts case of the fused-op kit (mpi_tests/support/fused_experts.hpp: the MLP block's
// sequence as the reference, the TP shards, the error model of the TP form) with
// dist::tp_experts on each rank's GPU as the fused op (dist/testing/gpu_fused.hpp): the router,
// the experts of this device's units with the segments left on the GPU (gpu::Segments::device)
// and the exact all_reduce over the TP axis. check, device_perf and single_device (skipped: the
// op holds a CCL) over the kit's grid, the program cache off and on, and trace = a CUDA graph of
// the whole op, replayed bit-equal to the eager call.
#include "dist/gpu/parallel/tp_experts.hpp"
#include "dist/testing/gpu/gpu_test.hpp"
#include "dist/testing/gpu_fused.hpp"
#include "mpi_tests/support/fused_experts.hpp"

namespace meshtest::dist::fused_test {
namespace {

/// The op on this device's GPU, on the capture's stream while the kit captures the graph (the
/// Blas's stream otherwise, then waited for: the kit reads complete outputs).
std::vector<DeviceTensor> experts_on_gpu(const FusedSetup& s, const MeshDevice& mesh,
                                         const std::vector<DeviceTensor>& local) {
  // One per rank, never destroyed: its plans and workspace outlive the kit's graphs.
  static auto& blas = *new meshtest::gpu::Blas;
  const GpuExpertShardRefs w{local[1], local[2], local[3], local[4], local[5], local[6]};
  std::vector<DeviceTensor> out;
  out.push_back(tp_experts(mesh, blas, local[0], w, config(s).moe_params(), {.axis = 1},
                           meshtest::gpu::Segments::device));
  blas.synchronize();  // nothing while capturing
  return out;
}

}  // namespace

MESHTEST_FUSED_OP_TESTS(gpu_experts,
                        experts_case("gpu_experts", testing::on_gpu_fused(experts_on_gpu)));

}  // namespace meshtest::dist::fused_test
