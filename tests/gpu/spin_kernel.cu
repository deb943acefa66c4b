// spin_kernel: a kernel that keeps one GPU thread busy for a given number of clock cycles.
#include "tests/gpu/spin_kernel.hpp"

namespace meshtest::gpu::testing {
namespace {

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

cudaError_t launch_spin(std::int64_t cycles, cudaStream_t stream) {
  spin<<<1, 1, 0, stream>>>(static_cast<long long>(cycles));
  return cudaGetLastError();
}

}  // namespace meshtest::gpu::testing
