// swiglu (GPU): checks, the output and the perf scope around one elementwise kernel.
#include "src/gpu/swiglu.hpp"

#include <cmath>
#include <string_view>

#include "src/gpu/elementwise_kernel.hpp"
#include "src/gpu/op_timer.hpp"
#include "src/gpu/runtime.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu {

DeviceTensor swiglu(const DeviceTensor& x, cudaStream_t stream, double alpha, double limit) {
  constexpr std::string_view op = "gpu swiglu";
  MESHTEST_CHECK(x.rank() >= 1 && x.shape()[x.rank() - 1] % 2 == 0,
                 "{}: x is {}, expected [..., 2I] (an even last dim)", op, describe(x));
  MESHTEST_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16,
                 "{}: x is {}: f32 or bf16 expected", op, describe(x));
  MESHTEST_CHECK(std::isfinite(alpha) && std::isfinite(limit) && limit > 0,
                 "{}: alpha {} must be finite and limit {} finite and > 0", op, alpha, limit);
  const std::int64_t half = x.shape()[x.rank() - 1] / 2;
  const std::int64_t rows = x.shape().outer(x.rank() - 1);
  const DeviceGuard guard(x.empty() ? current_device() : x.device());
  DeviceTensor y(x.shape().with(x.rank() - 1, half), x.dtype(), Tensor::Uninitialized{});
  perf::OpScope scope("swiglu");
  scope.input(info(x)).attr("alpha", alpha).attr("limit", limit);
  time_on_stream(scope, stream);  // last before the launch (see linear)
  MESHTEST_CUDA_CHECK(detail::launch_swiglu(
      x.dtype() == DType::bf16 ? detail::Float::bf16 : detail::Float::f32, x.bytes(), y.bytes(),
      rows, half, static_cast<float>(alpha), static_cast<float>(limit), stream));
  scope.output(info(y)).flops(kSwigluFlops * static_cast<double>(y.numel()));
  return y;
}

}  // namespace meshtest::gpu
