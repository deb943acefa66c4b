// gpu_devices: a program outside meshtest on the component gpu — the GPUs this process sees, or
// why none; with one, a tensor's round trip through device memory (meshtest::gpu); and, under
// MPI, whether this rank can take a GPU of its own (meshtest::dist_gpu).
#include <mpi.h>

#include <cstdio>
#include <string>

#include "dist/gpu/ccl/rank_gpu.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/runtime.hpp"

int main(int argc, char** argv) {
  namespace gpu = meshtest::gpu;
  MPI_Init(&argc, &argv);
  const std::string binding = meshtest::dist::gpu::gpu_binding_problem();
  std::printf("gpu_devices: binding ranks to GPUs: %s\n", binding.empty() ? "ok" : binding.c_str());
  int rc = 0;
  const int n = gpu::device_count();
  if (n == 0) {
    std::printf("gpu_devices: no GPU (%s)\n", gpu::no_gpu_reason().c_str());
  } else {
    const meshtest::Tensor host({2, 3}, meshtest::DType::f32);
    const bool same = gpu::DeviceTensor::from_host(host).to_host().bitwise_equal(host);
    std::printf("gpu_devices: %d GPU(s); round trip %s\n", n, same ? "exact" : "DIFFERS");
    rc = same ? 0 : 1;
  }
  MPI_Finalize();
  return rc;
}
