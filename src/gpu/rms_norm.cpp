// rms_norm (GPU): checks, the scale in f32, the output and the perf scope around one kernel.
#include "src/gpu/rms_norm.hpp"

#include <cmath>
#include <string_view>

#include "src/gpu/elementwise_kernel.hpp"
#include "src/gpu/op_timer.hpp"
#include "src/gpu/runtime.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu {

DeviceTensor rms_norm(const DeviceTensor& x, const DeviceTensor& scale, cudaStream_t stream,
                      double eps) {
  constexpr std::string_view op = "gpu rms_norm";
  MESHTEST_CHECK(x.rank() >= 1, "{}: x is {}, expected [..., hidden]", op, describe(x));
  MESHTEST_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16,
                 "{}: x is {}: f32 or bf16 expected", op, describe(x));
  const std::int64_t hidden = x.shape()[x.rank() - 1];
  MESHTEST_CHECK(scale.shape() == Shape{hidden} &&
                     (scale.dtype() == DType::f32 || scale.dtype() == DType::bf16),
                 "{}: scale is {}, expected f32 or bf16 [{}] (x is {})", op, describe(scale),
                 hidden, describe(x));
  MESHTEST_CHECK(eps >= 0 && std::isfinite(eps), "{}: eps is {}, expected a finite value >= 0", op,
                 eps);
  const int device = x.empty() ? current_device() : x.device();
  check_on_device(op, "scale", scale, device);
  const DeviceGuard guard(device);
  // The scale in f32 (exact for bf16), as the CPU op takes it in its compute type.
  const DeviceTensor scale32 = scale.dtype() == DType::f32
                                   ? DeviceTensor{}
                                   : DeviceTensor::from_host(scale.to_host().astype(DType::f32));
  const DeviceTensor& s = scale.dtype() == DType::f32 ? scale : scale32;
  DeviceTensor y(x.shape(), x.dtype(), Tensor::Uninitialized{});
  perf::OpScope scope("rms_norm");
  scope.input(info(x)).input(info(scale)).attr("eps", eps);
  time_on_stream(scope, stream);  // last before the launch (see linear)
  MESHTEST_CUDA_CHECK(detail::launch_rms_norm(
      x.dtype() == DType::bf16 ? detail::Float::bf16 : detail::Float::f32, x.bytes(),
      reinterpret_cast<const float*>(s.bytes()), y.bytes(), x.shape().outer(x.rank() - 1), hidden,
      static_cast<float>(eps), stream));
  scope.output(info(y)).flops(4.0 * static_cast<double>(x.numel()));
  return y;
}

}  // namespace meshtest::gpu
