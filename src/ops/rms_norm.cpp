// rms_norm: RMSNorm in f32 (f64 for f64 inputs), rounded to the input dtype.
#include "src/ops/rms_norm.hpp"

#include <cmath>

#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {

Tensor rms_norm(const Tensor& x, const Tensor& scale, double eps) {
  constexpr std::string_view op = "rms_norm";
  perf::OpScope scope(op);
  scope.input(x).input(scale).attr("eps", eps);
  MESHTEST_CHECK(x.rank() >= 1, "rms_norm: x has shape {}, expected [..., hidden]", x.shape());
  const std::int64_t hidden = x.shape()[x.rank() - 1];
  detail::check_shape(op, "scale", scale, Shape{hidden});
  MESHTEST_CHECK(is_floating(scale.dtype()),
                 "rms_norm: scale has dtype {}, expected f32, f64, bf16 or f16", scale.dtype());
  MESHTEST_CHECK(eps >= 0 && std::isfinite(eps),
                 "rms_norm: eps is {}, expected a finite value >= 0", eps);
  Tensor out = detail::visit_floating(x.dtype(), op, [&]<class S>(type_tag<S>) {
    using C = detail::compute_t<S>;
    const detail::ComputeMatrix<S> xm(x);
    const Tensor s = scale.astype(dtype_of<C>());
    const auto sv = s.vector<C>().transpose().array();
    RowMatrix<C> y(xm.map().rows(), hidden);
    for (Eigen::Index r = 0; r < y.rows(); ++r) {
      const auto row = xm.map().row(r).array();
      const C mean_sq = row.square().sum() / static_cast<C>(hidden);
      const C inv_rms = C(1) / std::sqrt(mean_sq + static_cast<C>(eps));
      y.row(r).array() = (row * inv_rms) * sv;
    }
    return detail::to_tensor<S>(y, x.shape());
  });
  scope.output(out).flops(4.0 * static_cast<double>(x.numel()));
  return out;
}

}  // namespace meshtest
