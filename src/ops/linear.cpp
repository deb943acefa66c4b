// linear: y = x Wᵀ + b through Eigen GEMM.
#include "src/ops/linear.hpp"

#include <algorithm>

#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

using detail::compute_t;
using detail::ComputeMatrix;

// Rows of a bf16 weight converted to f32 at a time: bounds the temporary of a large
// (e.g. unembedding) weight.
constexpr std::int64_t kWeightRowBlock = 2048;

template <class S>
Tensor linear_impl(const Tensor& x, const Tensor& weight, const Tensor* bias) {
  using C = compute_t<S>;
  const std::int64_t out = weight.shape()[0];
  const std::int64_t in = weight.shape()[1];
  const ComputeMatrix<S> xm(x, 0, x.shape().outer(x.rank() - 1), in);
  RowMatrix<C> y(xm.map().rows(), out);
  if constexpr (std::is_same_v<S, C>) {
    y.noalias() = xm.map() * weight.matrix<S>().transpose();
  } else {
    for (std::int64_t r0 = 0; r0 < out; r0 += kWeightRowBlock) {
      const std::int64_t n = std::min(kWeightRowBlock, out - r0);
      const ComputeMatrix<S> wb(weight, r0 * in, n, in);
      y.middleCols(r0, n).noalias() = xm.map() * wb.map().transpose();
    }
  }
  if (bias != nullptr) {
    const ComputeMatrix<S> b(*bias, 0, 1, out);
    y.rowwise() += b.map().row(0);
  }
  return detail::to_tensor<S>(y, x.shape().with(x.rank() - 1, out));
}

Tensor linear_checked(const Tensor& x, const Tensor& weight, const Tensor* bias) {
  constexpr std::string_view op = "linear";
  perf::OpScope scope(op);
  scope.input(x).input(weight);
  if (bias != nullptr) scope.input(*bias);
  MESHTEST_CHECK(x.rank() >= 1, "linear: x has shape {}, expected [..., in]", x.shape());
  detail::check_rank(op, "weight", weight, 2);
  MESHTEST_CHECK(weight.shape()[1] == x.shape()[x.rank() - 1],
                 "linear: weight has shape {} ([out, in]) but x has shape {} (in = {})",
                 weight.shape(), x.shape(), x.shape()[x.rank() - 1]);
  detail::check_dtype(op, "weight", weight, x.dtype());
  if (bias != nullptr) {
    detail::check_shape(op, "bias", *bias, Shape{weight.shape()[0]});
    detail::check_dtype(op, "bias", *bias, x.dtype());
  }
  Tensor y = detail::visit_floating(
      x.dtype(), op, [&]<class S>(type_tag<S>) { return linear_impl<S>(x, weight, bias); });
  const std::int64_t rows = x.shape().outer(x.rank() - 1);
  const std::int64_t in = weight.shape()[1], out = weight.shape()[0];
  scope.attr("in", in).attr("out", out).attr("bias", bias != nullptr);
  scope.output(y).flops(2.0 * static_cast<double>(rows * in * out) +
                        (bias != nullptr ? static_cast<double>(rows * out) : 0.0));
  return y;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_checked(x, weight, &bias);
}

Tensor linear(const Tensor& x, const Tensor& weight) { return linear_checked(x, weight, nullptr); }

}  // namespace meshtest
