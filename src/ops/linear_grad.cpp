// linear_backward through Eigen GEMMs.
#include "src/ops/linear_grad.hpp"

#include "src/ops/visit_real.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {

LinearGrads linear_backward(const Tensor& x, const Tensor& weight, const Tensor& grad_out,
                            const LinearBackwardOptions& opt) {
  perf::OpScope scope("linear_backward");
  scope.input(x).input(weight).input(grad_out);
  MESHTEST_CHECK(weight.rank() == 2, "linear_backward: weight has shape {}, expected [out, in]",
                 weight.shape());
  const std::int64_t out = weight.shape()[0], in = weight.shape()[1];
  MESHTEST_CHECK(x.rank() >= 1 && x.shape()[x.rank() - 1] == in,
                 "linear_backward: x has shape {} but weight is {} ([out, in])", x.shape(),
                 weight.shape());
  MESHTEST_CHECK(grad_out.shape() == x.shape().with(x.rank() - 1, out),
                 "linear_backward: grad_out has shape {}, expected {}", grad_out.shape(),
                 x.shape().with(x.rank() - 1, out));
  MESHTEST_CHECK(x.dtype() == weight.dtype() && x.dtype() == grad_out.dtype(),
                 "linear_backward: dtypes differ: x {}, weight {}, grad_out {}", x.dtype(),
                 weight.dtype(), grad_out.dtype());
  const std::int64_t rows = x.shape().outer(x.rank() - 1);
  scope.flops(2.0 * static_cast<double>(rows * in * out) * (opt.input + opt.weight));
  LinearGrads g;
  visit_real(x.dtype(), "linear_backward", [&]<class S>(type_tag<S>) {
    const Eigen::Map<const RowMatrix<S>> xm(x.data<S>(), rows, in);
    const Eigen::Map<const RowMatrix<S>> gm(grad_out.data<S>(), rows, out);
    if (opt.input) {
      g.input = Tensor(x.shape(), x.dtype());
      Eigen::Map<RowMatrix<S>>(g.input.data<S>(), rows, in).noalias() = gm * weight.matrix<S>();
    }
    if (opt.weight) {
      g.weight = Tensor(weight.shape(), x.dtype());
      g.weight.matrix<S>().noalias() = gm.transpose() * xm;
    }
    if (opt.bias) {
      g.bias = Tensor(Shape{out}, x.dtype());
      g.bias.vector<S>() = gm.colwise().sum().transpose();
    }
  });
  if (opt.input) scope.output(g.input);
  return g;
}

}  // namespace meshtest
