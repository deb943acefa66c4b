// The sdpa_sinks case of the fused-op kit (mpi_tests/support/fused_sdpa_sinks.hpp: the module's
// sdpa as the reference, the TP placements, the error model) with gpu::sdpa_sinks on each rank's
// GPU as the fused op (dist/testing/gpu_fused.hpp): check, device_perf (the kernel timed on the
// stream) and single_device over the kit's grid, the program cache off and on, and trace = a
// CUDA graph of the kernel, replayed bit-equal to the eager call.
#include "dist/testing/gpu/gpu_test.hpp"
#include "dist/testing/gpu_fused.hpp"
#include "mpi_tests/support/fused_sdpa_sinks.hpp"
#include "src/gpu/capture.hpp"
#include "src/gpu/runtime.hpp"
#include "src/gpu/sdpa.hpp"

namespace meshtest::dist::fused_test {
namespace {

/// This device's heads on its GPU, on the capture's stream while the kit captures the graph
/// (the default stream otherwise, then waited for: the kit reads complete outputs).
std::vector<DeviceTensor> sdpa_sinks_on_gpu(const FusedSetup& s, const MeshDevice&,
                                            const std::vector<DeviceTensor>& local) {
  const cudaStream_t stream = meshtest::gpu::stream_for(nullptr);
  std::vector<DeviceTensor> out;
  out.push_back(meshtest::gpu::sdpa_sinks(local[0], local[1], local[2], local[3], stream,
                                          sdpa_sinks_options(s)));
  if (meshtest::gpu::capturing_stream() == nullptr) {
    MESHTEST_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return out;
}

}  // namespace

MESHTEST_FUSED_OP_TESTS(gpu_sdpa_sinks, sdpa_sinks_case("gpu_sdpa_sinks",
                                                        testing::on_gpu_fused(sdpa_sinks_on_gpu)));

}  // namespace meshtest::dist::fused_test
