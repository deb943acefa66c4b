// index_flag: a "first bad index" that GPU kernels lower and the host reads afterwards, for the
// checks that must see a kernel's result to raise an Error (a NaN logit, an expert id or an
// offset out of range).
#pragma once

#include <cuda_runtime_api.h>

#include "src/gpu/capture.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/moe_kernel.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::gpu {

/// kNoIndex on the GPU until a kernel lowers it (atomicMin), read after the stream.
class IndexFlag {
 public:
  explicit IndexFlag(cudaStream_t stream)
      : flag_(Shape{1}, DType::i64, Tensor::Uninitialized{}), stream_(stream) {
    MESHTEST_CUDA_CHECK(cudaMemsetAsync(flag_.bytes(), 0xff, sizeof(std::uint64_t), stream));
  }
  unsigned long long* get() { return reinterpret_cast<unsigned long long*>(flag_.bytes()); }
  /// Synchronizes the stream; the index, or detail::kNoIndex. While this thread captures a
  /// gpu::Graph nothing can be read: kNoIndex, the check is not made (a graph cannot stop on
  /// it; the eager call before the capture, or a replay's outputs, show what it would have).
  unsigned long long read() const {
    if (capturing_stream() != nullptr) return detail::kNoIndex;
    MESHTEST_CUDA_CHECK(cudaStreamSynchronize(stream_));
    unsigned long long v = 0;
    MESHTEST_CUDA_CHECK(cudaMemcpy(&v, flag_.bytes(), sizeof v, cudaMemcpyDeviceToHost));
    return v;
  }

 private:
  DeviceTensor flag_;
  cudaStream_t stream_;
};

}  // namespace meshtest::gpu
