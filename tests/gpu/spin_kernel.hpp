// spin_kernel: a kernel that keeps one GPU thread busy for a given time (the op timer's tests).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtest::gpu::testing {

/// Queues on `stream` one thread that spins until `cycles` of the SM clock have passed.
cudaError_t launch_spin(std::int64_t cycles, cudaStream_t stream);

}  // namespace meshtest::gpu::testing
