// swiglu_grad: SiLU forward and backward, and the backward of the gpt-oss clamped SwiGLU.
#include "src/ops/swiglu_grad.hpp"

#include <algorithm>
#include <cmath>

#include "src/ops/compute.hpp"
#include "src/ops/visit_real.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

template <class C>
C sigmoid(C z) {
  return C(1) / (C(1) + std::exp(-z));
}

}  // namespace

Tensor silu(const Tensor& x) {
  perf::OpScope scope("silu");
  scope.input(x);
  Tensor out = detail::visit_floating(x.dtype(), "silu", [&]<class S>(type_tag<S>) {
    using C = detail::compute_t<S>;
    const detail::ComputeMatrix<S> xm(x);
    const RowMatrix<C> y = xm.map().unaryExpr([](C v) { return v * sigmoid(v); });
    return detail::to_tensor<S>(y, x.shape());
  });
  scope.output(out).flops(4.0 * static_cast<double>(x.numel()));
  return out;
}

Tensor silu_backward(const Tensor& x, const Tensor& grad_out) {
  perf::OpScope scope("silu_backward");
  scope.input(x).input(grad_out);
  detail::check_shape("silu_backward", "grad_out", grad_out, x.shape());
  detail::check_dtype("silu_backward", "grad_out", grad_out, x.dtype());
  Tensor gx(x.shape(), x.dtype());
  visit_real(x.dtype(), "silu_backward", [&]<class S>(type_tag<S>) {
    const auto xv = x.vector<S>();
    const auto gv = grad_out.vector<S>();
    auto out = gx.vector<S>();
    for (Eigen::Index i = 0; i < out.size(); ++i) {
      const S s = sigmoid(xv(i));
      out(i) = gv(i) * s * (S(1) + xv(i) * (S(1) - s));
    }
  });
  scope.output(gx).flops(7.0 * static_cast<double>(x.numel()));
  return gx;
}

Tensor swiglu_backward(const Tensor& x, const Tensor& grad_out, double alpha, double limit) {
  constexpr std::string_view op = "swiglu_backward";
  perf::OpScope scope(op);
  scope.input(x).input(grad_out).attr("alpha", alpha).attr("limit", limit);
  MESHTEST_CHECK(x.rank() >= 1 && x.shape()[x.rank() - 1] % 2 == 0,
                 "swiglu_backward: x has shape {}, expected [..., 2I] (an even last dim)",
                 x.shape());
  MESHTEST_CHECK(std::isfinite(alpha) && std::isfinite(limit) && limit > 0,
                 "swiglu_backward: alpha {} must be finite and limit {} finite and > 0", alpha,
                 limit);
  const std::int64_t two_i = x.shape()[x.rank() - 1];
  detail::check_shape(op, "grad_out", grad_out, x.shape().with(x.rank() - 1, two_i / 2));
  detail::check_dtype(op, "grad_out", grad_out, x.dtype());
  Tensor gx(x.shape(), x.dtype());
  visit_real(x.dtype(), op, [&]<class S>(type_tag<S>) {
    const S a = static_cast<S>(alpha);
    const S lim = static_cast<S>(limit);
    const S* xp = x.data<S>();
    const S* gp = grad_out.data<S>();
    S* out = gx.data<S>();
    // Element c of grad_out pairs with x columns 2c (glu) and 2c + 1 (lin) of the same row,
    // so over the flat buffers pair c sits at 2c and 2c + 1.
    for (std::int64_t c = 0; c < grad_out.numel(); ++c) {
      const S x_glu = xp[2 * c], x_lin = xp[2 * c + 1];
      const S g = std::min(x_glu, lim);
      const S l = std::clamp(x_lin, -lim, lim);
      const S s = sigmoid(a * g);
      out[2 * c] = x_glu <= lim ? gp[c] * (l + S(1)) * s * (S(1) + a * g * (S(1) - s)) : S(0);
      out[2 * c + 1] = std::abs(x_lin) <= lim ? gp[c] * g * s : S(0);
    }
  });
  scope.output(gx).flops(14.0 * static_cast<double>(grad_out.numel()));
  return gx;
}

}  // namespace meshtest
