// dpsgd_cuda: meshtest-bench dpsgd --device cuda (bench/bench_dpsgd.cpp): one gradient
// computation of a DP mode on a GPU model (src/gpu/dp_model.hpp), timed and with its peak GPU
// memory. Built with the GPU side.
#pragma once

#include <cstdint>
#include <string>

#include "src/core/tensor.hpp"
#include "src/dp/sequential.hpp"

namespace meshtest::bench {

/// Throws meshtest::Error "--device cuda: no GPU: <the runtime's reason>" when this process
/// sees no GPU.
void check_dp_cuda();

/// One measured step on the current GPU.
struct CudaDpSample {
  double seconds = 0;     ///< forward, norms, clipping and the clipped sum, complete
  std::int64_t peak = 0;  ///< bytes: the peak of meshtest's GPU tensors (weights and data included)
};

/// Copies `model`, x and y to the GPU (not timed), then times `mode`'s gradient computation
/// (gpu::dp::Model::compute) with its peak of gpu::peak_memory.
CudaDpSample measure_dp_cuda(const dp::Sequential& model, const std::string& mode, const Tensor& x,
                             const Tensor& y, double clip);

}  // namespace meshtest::bench
