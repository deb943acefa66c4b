// dpsgd_cuda: one DP step of a mode on a GPU model, timed on the host (every GPU op of the model
// is complete when it returns), its peak from the device tensors' own high-water mark.
#include "bench/dpsgd_cuda.hpp"

#include <chrono>

#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/dp_model.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::bench {

void check_dp_cuda() {
  MESHTEST_CHECK(gpu::device_count() > 0, "--device cuda: no GPU: {}", gpu::no_gpu_reason());
}

CudaDpSample measure_dp_cuda(const dp::Sequential& model, const std::string& mode, const Tensor& x,
                             const Tensor& y, double clip) {
  // One Blas for the process (its plans cached across steps), never destroyed: its stream and
  // handle would otherwise outlive the CUDA context at exit.
  static gpu::Blas* const blas = new gpu::Blas;
  const int device = blas->device();
  gpu::dp::Model gpu_model(*blas, model);
  const gpu::DeviceTensor dx = gpu::DeviceTensor::from_host(x);
  const gpu::DeviceTensor dy = gpu::DeviceTensor::from_host(y);
  blas->synchronize();
  gpu::reset_peak_memory(device);
  const auto t0 = std::chrono::steady_clock::now();
  (void)gpu_model.compute(dx, dy, mode, {.clip = clip});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {.seconds = seconds, .peak = static_cast<std::int64_t>(gpu::peak_memory(device))};
}

}  // namespace meshtest::bench
