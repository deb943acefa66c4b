// Element-wise ops: add, add_bias.
#include "src/ops/elementwise.hpp"

#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {

Tensor add(const Tensor& a, const Tensor& b) {
  perf::OpScope scope("add");
  scope.input(a).input(b);
  detail::check_shape("add", "b", b, a.shape());
  detail::check_dtype("add", "b", b, a.dtype());
  Tensor out = detail::visit_floating(a.dtype(), "add", [&]<class S>(type_tag<S>) {
    using C = detail::compute_t<S>;
    const detail::ComputeMatrix<S> am(a, 0, 1, a.numel());
    const detail::ComputeMatrix<S> bm(b, 0, 1, b.numel());
    const RowMatrix<C> sum = am.map() + bm.map();
    return detail::to_tensor<S>(sum, a.shape());
  });
  scope.output(out).flops(static_cast<double>(a.numel()));
  return out;
}

Tensor add_bias(const Tensor& x, const Tensor& bias) {
  perf::OpScope scope("add_bias");
  scope.input(x).input(bias);
  MESHTEST_CHECK(x.rank() >= 1, "add_bias: x has shape {}, expected [..., n]", x.shape());
  const std::int64_t n = x.shape()[x.rank() - 1];
  detail::check_shape("add_bias", "bias", bias, Shape{n});
  detail::check_dtype("add_bias", "bias", bias, x.dtype());
  Tensor out = detail::visit_floating(x.dtype(), "add_bias", [&]<class S>(type_tag<S>) {
    using C = detail::compute_t<S>;
    const detail::ComputeMatrix<S> xm(x, 0, x.shape().outer(x.rank() - 1), n);
    const detail::ComputeMatrix<S> bm(bias, 0, 1, n);
    RowMatrix<C> y = xm.map();
    y.rowwise() += bm.map().row(0);
    return detail::to_tensor<S>(y, x.shape());
  });
  scope.output(out).flops(static_cast<double>(x.numel()));
  return out;
}

}  // namespace meshtest
