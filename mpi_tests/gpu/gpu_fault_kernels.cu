// gpu_fault_kernels: the faulting kernels of the GPU fault cases.
#include "mpi_tests/gpu/gpu_fault_kernels.hpp"

namespace meshtest::gpu_fault_case {
namespace {

__global__ void write_through(int* p) { *static_cast<volatile int*>(p) = 1; }

__global__ void trap() { __trap(); }

}  // namespace

cudaError_t launch_write_through(int* p, cudaStream_t stream) {
  write_through<<<1, 1, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_trap(cudaStream_t stream) {
  trap<<<1, 1, 0, stream>>>();
  return cudaGetLastError();
}

}  // namespace meshtest::gpu_fault_case
