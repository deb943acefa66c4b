// linear (GPU): checks, the output, the perf scope, then one cuBLASLt GEMM.
#include "src/gpu/linear.hpp"

#include <cstdint>
#include <string_view>

#include "src/gpu/op_timer.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu {
namespace {

constexpr std::string_view kOp = "gpu linear";

DeviceTensor linear_checked(Blas& blas, const DeviceTensor& x, const DeviceTensor& weight,
                            const DeviceTensor* bias) {
  check_linear(blas, x, weight, bias);
  const std::int64_t in = weight.shape()[1], out = weight.shape()[0];
  const std::int64_t rows = x.shape().outer(x.rank() - 1);
  // The output is allocated before the scope opens, so that the stream's time covers the GEMM,
  // in the order of the stream: a pool allocation of a few microseconds, where a cudaMalloc
  // (tens) let the GPU finish the previous op and wait for this launch inside its timed span.
  DeviceTensor y(x.shape().with(x.rank() - 1, out), x.dtype(), StreamOrdered{blas.shared_stream()});
  perf::OpScope scope("linear");
  // The record's fields first and the start event last, right before the launch: on an idle
  // stream the event completes at once, and host work after it would count as the op's time.
  scope.input(info(x)).input(info(weight));
  if (bias != nullptr) scope.input(info(*bias));
  scope.attr("in", in).attr("out", out).attr("bias", bias != nullptr);
  time_on_stream(scope, blas.stream());
  blas.gemm_unchecked(x.dtype(), rows, out, in, x.bytes(), weight.bytes(),
                      bias != nullptr ? bias->bytes() : nullptr, y.bytes());
  scope.output(info(y)).flops(2.0 * static_cast<double>(rows * in * out) +
                              (bias != nullptr ? static_cast<double>(rows * out) : 0.0));
  return y;
}

}  // namespace

void check_linear(const Blas& blas, const DeviceTensor& x, const DeviceTensor& weight,
                  const DeviceTensor* bias) {
  MESHTEST_CHECK(x.rank() >= 1, "{}: x is {}, expected [..., in]", kOp, describe(x));
  MESHTEST_CHECK(weight.rank() == 2 && weight.shape()[1] == x.shape()[x.rank() - 1],
                 "{}: weight is {} but x is {}: expected weight [out, in] with in = {}", kOp,
                 describe(weight), describe(x), x.shape()[x.rank() - 1]);
  MESHTEST_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16,
                 "{}: x is {}: f32 or bf16 expected", kOp, describe(x));
  check_dtype(kOp, "weight", weight, x.dtype());
  if (bias != nullptr) {
    MESHTEST_CHECK(bias->shape() == Shape{weight.shape()[0]},
                   "{}: bias is {}, expected [{}] (weight is {})", kOp, describe(*bias),
                   weight.shape()[0], describe(weight));
    check_dtype(kOp, "bias", *bias, x.dtype());
  }
  check_on_device(kOp, "x", x, blas.device());
  check_on_device(kOp, "weight", weight, blas.device());
  if (bias != nullptr) check_on_device(kOp, "bias", *bias, blas.device());
}

DeviceTensor linear(Blas& blas, const DeviceTensor& x, const DeviceTensor& weight,
                    const DeviceTensor& bias) {
  return linear_checked(blas, x, weight, &bias);
}

DeviceTensor linear(Blas& blas, const DeviceTensor& x, const DeviceTensor& weight) {
  return linear_checked(blas, x, weight, nullptr);
}

}  // namespace meshtest::gpu
