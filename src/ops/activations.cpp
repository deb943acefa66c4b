// activations: gpt-oss swiglu.
#include "src/ops/activations.hpp"

#include <algorithm>
#include <cmath>

#include "src/perf/profiler.hpp"

namespace meshtest {
namespace detail {

template <class S>
RowMatrix<compute_t<S>> swiglu_rows(const Eigen::Ref<const RowMatrix<compute_t<S>>>& x,
                                    double alpha, double limit) {
  using C = compute_t<S>;
  const auto r = [](C v) { return round_as<S>(v); };
  const C a = static_cast<C>(alpha);
  const C lim = static_cast<C>(limit);
  const Eigen::Index half = x.cols() / 2;
  RowMatrix<C> out(x.rows(), half);
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index j = 0; j < half; ++j) {
      const C glu = std::min(x(i, 2 * j), lim);
      const C lin = std::clamp(x(i, 2 * j + 1), -lim, lim);
      const C sig = r(C(1) / (C(1) + std::exp(-r(a * glu))));
      out(i, j) = r(r(glu * sig) * r(lin + C(1)));
    }
  }
  return out;
}

template RowMatrix<float> swiglu_rows<float>(const Eigen::Ref<const RowMatrix<float>>&, double,
                                             double);
template RowMatrix<double> swiglu_rows<double>(const Eigen::Ref<const RowMatrix<double>>&, double,
                                               double);
template RowMatrix<float> swiglu_rows<bf16>(const Eigen::Ref<const RowMatrix<float>>&, double,
                                            double);

}  // namespace detail

Tensor swiglu(const Tensor& x, double alpha, double limit) {
  perf::OpScope scope("swiglu");
  scope.input(x).attr("alpha", alpha).attr("limit", limit);
  MESHTEST_CHECK(x.rank() >= 1 && x.shape()[x.rank() - 1] % 2 == 0,
                 "swiglu: x has shape {}, expected [..., 2I] (an even last dim)", x.shape());
  MESHTEST_CHECK(std::isfinite(alpha) && std::isfinite(limit) && limit > 0,
                 "swiglu: alpha {} must be finite and limit {} finite and > 0", alpha, limit);
  Tensor out = detail::visit_floating(x.dtype(), "swiglu", [&]<class S>(type_tag<S>) {
    const detail::ComputeMatrix<S> xm(x);
    const auto y = detail::swiglu_rows<S>(xm.map(), alpha, limit);
    return detail::to_tensor<S>(y, x.shape().with(x.rank() - 1, x.shape()[x.rank() - 1] / 2));
  });
  scope.output(out).flops(kSwigluFlops * static_cast<double>(out.numel()));
  return out;
}

}  // namespace meshtest
