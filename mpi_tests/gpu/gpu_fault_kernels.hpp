// gpu_fault_kernels: kernels that fault on purpose, for the GPU fault cases (gpu_fault_case).
// Plain types only: the .cu includes no meshtest header.
#pragma once

#include <cuda_runtime_api.h>

namespace meshtest::gpu_fault_case {

/// Queues one thread that writes through `p` on `stream`: given a pointer to nothing (null), the
/// kernel faults with cudaErrorIllegalAddress, which the stream reports once it gets there and
/// which makes every later call of the process's CUDA context fail. Returns the launch's error.
cudaError_t launch_write_through(int* p, cudaStream_t stream);

/// Queues one thread that executes a trap instruction (__trap) on `stream`: the kernel aborts,
/// a launch failure the stream reports once it gets there (cudaErrorLaunchFailure), as sticky
/// as an illegal address. Returns the launch's error.
cudaError_t launch_trap(cudaStream_t stream);

}  // namespace meshtest::gpu_fault_case
