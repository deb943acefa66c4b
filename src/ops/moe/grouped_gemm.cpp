// grouped_gemm: one Eigen GEMM per segment of rows, on Maps of x, W[e] and out (f32, f64), or on
// f32 views converted once (bf16); and its backward.
#include "src/ops/moe/grouped_gemm.hpp"

#include "src/ops/compute.hpp"
#include "src/ops/visit_real.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

using detail::compute_t;
using detail::ComputeMatrix;
using detail::round_all;

template <class T>
using ConstRows = Eigen::Map<const RowMatrix<T>>;
template <class T>
using Rows = Eigen::Map<RowMatrix<T>>;

// Checks x [rows, in], w [G, out, in], offsets [G + 1] from 0 to rows, non-decreasing.
void check_segments(std::string_view op, const Tensor& x, std::span<const std::int64_t> offsets,
                    const Tensor& w) {
  detail::check_rank(op, "x ([rows, in])", x, 2);
  detail::check_rank(op, "w ([G, out, in])", w, 3);
  const std::int64_t groups = w.shape()[0];
  MESHTEST_CHECK(w.shape()[2] == x.shape()[1],
                 "{}: w has shape {} ([G, out, in]) but x has shape {} (in = {})", op, w.shape(),
                 x.shape(), x.shape()[1]);
  detail::check_dtype(op, "w", w, x.dtype());
  MESHTEST_CHECK(static_cast<std::int64_t>(offsets.size()) == groups + 1,
                 "{}: {} offsets for {} groups (w has shape {}), expected {}", op, offsets.size(),
                 groups, w.shape(), groups + 1);
  MESHTEST_CHECK(offsets.front() == 0 && offsets.back() == x.shape()[0],
                 "{}: offsets run from {} to {}, expected 0 to {} (the rows of x)", op,
                 offsets.front(), offsets.back(), x.shape()[0]);
  for (std::int64_t e = 0; e < groups; ++e) {
    MESHTEST_CHECK(offsets[e] <= offsets[e + 1], "{}: offsets decrease at group {} ({} then {})",
                   op, e, offsets[e], offsets[e + 1]);
  }
}

template <class S>
Tensor forward_impl(const Tensor& x, std::span<const std::int64_t> offsets, const Tensor& w,
                    const Tensor* bias) {
  using C = compute_t<S>;
  const std::int64_t in = x.shape()[1], out = w.shape()[1];
  const std::int64_t groups = w.shape()[0];
  Tensor y(Shape{x.shape()[0], out}, x.dtype(), Tensor::Uninitialized{});
  // bf16: x converted to f32 once; each product rounded, then each bias sum (as moe_experts).
  const ComputeMatrix<S> xc(x, 0, x.shape()[0], in);
  RowMatrix<C> seg_out;
  for (std::int64_t e = 0; e < groups; ++e) {
    const std::int64_t r0 = offsets[e], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    const ComputeMatrix<S> we(w, e * out * in, out, in);
    const auto xs = xc.map().middleRows(r0, n);
    if constexpr (std::is_same_v<S, C>) {
      Rows<S> ys(y.data<S>() + r0 * out, n, out);
      ys.noalias() = xs * we.map().transpose();
      if (bias != nullptr) ys.rowwise() += ConstRows<S>(bias->data<S>() + e * out, 1, out).row(0);
    } else {
      seg_out.resize(n, out);
      seg_out.noalias() = xs * we.map().transpose();
      round_all<S>(seg_out);
      if (bias != nullptr) {
        const ComputeMatrix<S> be(*bias, e * out, 1, out);
        seg_out.rowwise() += be.map().row(0);
      }
      Rows<S>(y.data<S>() + r0 * out, n, out) = seg_out.template cast<S>();
    }
  }
  return y;
}

}  // namespace

Tensor grouped_gemm(const Tensor& x, std::span<const std::int64_t> offsets, const Tensor& w,
                    const Tensor& bias) {
  constexpr std::string_view op = "grouped_gemm";
  perf::OpScope scope(op);
  scope.input(x).input(w);
  check_segments(op, x, offsets, w);
  const Tensor* b = detail::is_unset(bias) ? nullptr : &bias;
  if (b != nullptr) {
    scope.input(*b);
    detail::check_shape(op, "bias", *b, Shape{w.shape()[0], w.shape()[1]});
    detail::check_dtype(op, "bias", *b, x.dtype());
  }
  Tensor y = detail::visit_floating(
      x.dtype(), op, [&]<class S>(type_tag<S>) { return forward_impl<S>(x, offsets, w, b); });
  const double rows = static_cast<double>(x.shape()[0]);
  const double in = static_cast<double>(w.shape()[2]), out = static_cast<double>(w.shape()[1]);
  scope.attr("groups", w.shape()[0]).attr("bias", b != nullptr);
  scope.output(y).flops(2.0 * rows * in * out + (b != nullptr ? rows * out : 0.0));
  return y;
}

GroupedGemmGrads grouped_gemm_backward(const Tensor& x, std::span<const std::int64_t> offsets,
                                       const Tensor& w, const Tensor& grad_out) {
  constexpr std::string_view op = "grouped_gemm_backward";
  perf::OpScope scope(op);
  scope.input(x).input(w).input(grad_out);
  check_segments(op, x, offsets, w);
  const std::int64_t rows = x.shape()[0], in = x.shape()[1];
  const std::int64_t groups = w.shape()[0], out = w.shape()[1];
  detail::check_shape(op, "grad_out", grad_out, Shape{rows, out});
  detail::check_dtype(op, "grad_out", grad_out, x.dtype());
  GroupedGemmGrads g{.x = Tensor(x.shape(), x.dtype(), Tensor::Uninitialized{}),
                     .w = Tensor(w.shape(), x.dtype()),
                     .bias = Tensor(Shape{groups, out}, x.dtype())};
  visit_real(x.dtype(), op, [&]<class S>(type_tag<S>) {
    for (std::int64_t e = 0; e < groups; ++e) {
      const std::int64_t r0 = offsets[e], n = offsets[e + 1] - offsets[e];
      if (n == 0) continue;  // grad_w[e] and grad_bias[e] stay zero
      const ConstRows<S> xs(x.data<S>() + r0 * in, n, in);
      const ConstRows<S> gs(grad_out.data<S>() + r0 * out, n, out);
      const ConstRows<S> we(w.data<S>() + e * out * in, out, in);
      Rows<S>(g.x.data<S>() + r0 * in, n, in).noalias() = gs * we;
      Rows<S>(g.w.data<S>() + e * out * in, out, in).noalias() = gs.transpose() * xs;
      Rows<S>(g.bias.data<S>() + e * out, 1, out) = gs.colwise().sum();
    }
  });
  scope.output(g.x).flops(4.0 * static_cast<double>(rows * in * out) +
                          static_cast<double>(rows * out));
  return g;
}

}  // namespace meshtest
