// rms_norm_backward row by row through Eigen arrays.
#include "src/ops/rms_norm_grad.hpp"

#include <cmath>

#include "src/ops/visit_real.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {

RmsNormGrads rms_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& grad_out,
                               double eps) {
  perf::OpScope scope("rms_norm_backward");
  scope.input(x).input(scale).input(grad_out).attr("eps", eps);
  MESHTEST_CHECK(x.rank() >= 1, "rms_norm_backward: x has shape {}, expected [..., d]", x.shape());
  const std::int64_t d = x.shape()[x.rank() - 1];
  const std::int64_t rows = x.shape().outer(x.rank() - 1);
  MESHTEST_CHECK(scale.shape() == Shape{d} && grad_out.shape() == x.shape(),
                 "rms_norm_backward: x {}, scale {}, grad_out {}; expected scale [{}] and "
                 "grad_out of x's shape",
                 x.shape(), scale.shape(), grad_out.shape(), d);
  MESHTEST_CHECK(x.dtype() == scale.dtype() && x.dtype() == grad_out.dtype(),
                 "rms_norm_backward: dtypes differ: x {}, scale {}, grad_out {}", x.dtype(),
                 scale.dtype(), grad_out.dtype());
  RmsNormGrads g{.input = Tensor(x.shape(), x.dtype()),
                 .scale_rows = Tensor(Shape{rows, d}, x.dtype())};
  visit_real(x.dtype(), "rms_norm_backward", [&]<class S>(type_tag<S>) {
    const Eigen::Map<const RowMatrix<S>> xm(x.data<S>(), rows, d);
    const Eigen::Map<const RowMatrix<S>> gm(grad_out.data<S>(), rows, d);
    Eigen::Map<RowMatrix<S>> gx(g.input.data<S>(), rows, d);
    auto gs = g.scale_rows.matrix<S>();
    const auto s = scale.vector<S>().transpose().array();
    for (Eigen::Index r = 0; r < rows; ++r) {
      const auto xr = xm.row(r).array();
      const S inv_rms =
          S(1) / std::sqrt(xr.square().sum() / static_cast<S>(d) + static_cast<S>(eps));
      const auto xhat = xr * inv_rms;
      const auto gsr = gm.row(r).array() * s;
      const S mean_dot = (gsr * xhat).sum() / static_cast<S>(d);
      gx.row(r).array() = inv_rms * (gsr - xhat * mean_dot);
      gs.row(r).array() = gm.row(r).array() * xhat;
    }
  });
  scope.output(g.input);
  return g;
}

}  // namespace meshtest
