// gpu_devices: a program outside meshtest on meshtest::gpu — the GPUs this process sees, or why
// none; with one, a tensor's round trip through device memory.
#include <cstdio>

#include "src/gpu/device_tensor.hpp"
#include "src/gpu/runtime.hpp"

int main() {
  namespace gpu = meshtest::gpu;
  const int n = gpu::device_count();
  if (n == 0) {
    std::printf("gpu_devices: no GPU (%s)\n", gpu::no_gpu_reason().c_str());
    return 0;
  }
  const meshtest::Tensor host({2, 3}, meshtest::DType::f32);
  const bool same = gpu::DeviceTensor::from_host(host).to_host().bitwise_equal(host);
  std::printf("gpu_devices: %d GPU(s); round trip %s\n", n, same ? "exact" : "DIFFERS");
  return same ? 0 : 1;
}
