// gelu and relu element-wise through Eigen arrays.
#include "src/ops/gelu.hpp"

#include <cmath>
#include <numbers>
#include <string_view>

#include "src/ops/visit_real.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

// out = f(x) element-wise (unary) or f(x, grad_out) (binary), in x's dtype.
template <class F>
Tensor unary(std::string_view op, const Tensor& x, F f) {
  perf::OpScope scope(op);
  scope.input(x);
  Tensor y(x.shape(), x.dtype());
  visit_real(x.dtype(), op, [&]<class S>(type_tag<S>) {
    y.vector<S>() = x.vector<S>().unaryExpr([&](S v) { return f(v); });
  });
  scope.output(y);
  return y;
}

template <class F>
Tensor binary(std::string_view op, const Tensor& x, const Tensor& grad_out, F f) {
  perf::OpScope scope(op);
  scope.input(x).input(grad_out);
  MESHTEST_CHECK(x.shape() == grad_out.shape() && x.dtype() == grad_out.dtype(),
                 "{}: x is {} but grad_out is {} (expected the same shape and dtype)", op,
                 describe(x), describe(grad_out));
  Tensor y(x.shape(), x.dtype());
  visit_real(x.dtype(), op, [&]<class S>(type_tag<S>) {
    y.vector<S>() =
        x.vector<S>().binaryExpr(grad_out.vector<S>(), [&](S v, S g) { return f(v, g); });
  });
  scope.output(y);
  return y;
}

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

}  // namespace

Tensor gelu(const Tensor& x) {
  return unary("gelu", x, []<class S>(S v) {
    return static_cast<S>(0.5) * v * (static_cast<S>(1) + std::erf(v * static_cast<S>(kInvSqrt2)));
  });
}

Tensor gelu_backward(const Tensor& x, const Tensor& grad_out) {
  return binary("gelu_backward", x, grad_out, []<class S>(S v, S g) {
    const S cdf =
        static_cast<S>(0.5) * (static_cast<S>(1) + std::erf(v * static_cast<S>(kInvSqrt2)));
    const S pdf = static_cast<S>(kInvSqrt2Pi) * std::exp(static_cast<S>(-0.5) * v * v);
    return g * (cdf + v * pdf);
  });
}

Tensor relu(const Tensor& x) {
  return unary("relu", x, []<class S>(S v) { return v > 0 ? v : static_cast<S>(0); });
}

Tensor relu_backward(const Tensor& x, const Tensor& grad_out) {
  return binary("relu_backward", x, grad_out,
                []<class S>(S v, S g) { return v > 0 ? g : static_cast<S>(0); });
}

}  // namespace meshtest
