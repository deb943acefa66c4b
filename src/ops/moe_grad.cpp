// moe_grad: the routed experts' backward, one pass of GEMMs per expert over its rows.
#include "src/ops/moe_grad.hpp"

#include <string_view>
#include <utility>
#include <vector>

#include "src/ops/compute.hpp"
#include "src/ops/swiglu_grad.hpp"
#include "src/ops/visit_real.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

constexpr std::string_view kOp = "moe_backward";

void check_inputs(const Tensor& t, const Routing& r, const Tensor& mlp1_weight,
                  const Tensor& mlp1_bias, const Tensor& mlp2_weight, const Tensor& mlp2_bias,
                  const Tensor& grad_out) {
  detail::check_rank(kOp, "t ([T, hidden])", t, 2);
  detail::check_rank(kOp, "mlp1_weight ([experts, 2I, hidden])", mlp1_weight, 3);
  const std::int64_t tokens = t.shape()[0], hidden = t.shape()[1];
  const std::int64_t experts = mlp1_weight.shape()[0], two_i = mlp1_weight.shape()[1];
  MESHTEST_CHECK(two_i % 2 == 0, "moe_backward: mlp1_weight has shape {}; its dim 1 must be even",
                 mlp1_weight.shape());
  detail::check_shape(kOp, "mlp1_weight", mlp1_weight, Shape{experts, two_i, hidden});
  detail::check_shape(kOp, "mlp1_bias", mlp1_bias, Shape{experts, two_i});
  detail::check_shape(kOp, "mlp2_weight", mlp2_weight, Shape{experts, hidden, two_i / 2});
  detail::check_shape(kOp, "mlp2_bias", mlp2_bias, Shape{experts, hidden});
  detail::check_shape(kOp, "grad_out", grad_out, Shape{tokens, hidden});
  MESHTEST_CHECK(r.num_tokens == tokens && r.k >= 1 &&
                     static_cast<std::int64_t>(r.experts.size()) == tokens * r.k,
                 "moe_backward: routing is for {} tokens x k {} ({} experts listed), expected {} "
                 "tokens",
                 r.num_tokens, r.k, r.experts.size(), tokens);
  detail::check_shape(kOp, "routing.weights", r.weights, Shape{tokens, r.k});
  const std::pair<std::string_view, const Tensor*> named[] = {
      {"mlp1_weight", &mlp1_weight}, {"mlp1_bias", &mlp1_bias}, {"mlp2_weight", &mlp2_weight},
      {"mlp2_bias", &mlp2_bias},     {"grad_out", &grad_out},   {"routing.weights", &r.weights}};
  for (const auto& [name, w] : named) {
    detail::check_dtype(kOp, name, *w, t.dtype());
  }
}

// Slots grouped by expert, ascending within an expert.
std::vector<std::vector<std::int64_t>> group_slots(const Routing& r, std::int64_t experts) {
  std::vector<std::vector<std::int64_t>> slots(static_cast<std::size_t>(experts));
  for (std::size_t s = 0; s < r.experts.size(); ++s) {
    const std::int64_t e = r.experts[s];
    MESHTEST_CHECK(e >= 0 && e < experts, "moe_backward: routing names expert {}, expected [0, {})",
                   e, experts);
    slots[e].push_back(static_cast<std::int64_t>(s));
  }
  return slots;
}

template <class S>
MoeGrads backward_impl(const Tensor& t, const Routing& r, const Tensor& mlp1_weight,
                       const Tensor& mlp1_bias, const Tensor& mlp2_weight, const Tensor& mlp2_bias,
                       const Tensor& grad_out, const MoeParams& p) {
  using Map = Eigen::Map<const RowMatrix<S>>;
  const DType dt = t.dtype();
  const std::int64_t experts = mlp1_weight.shape()[0], two_i = mlp1_weight.shape()[1];
  const std::int64_t hidden = t.shape()[1], inter = two_i / 2, k = r.k;
  MoeGrads g{.t = Tensor(t.shape(), dt),
             .weights = Tensor(r.weights.shape(), dt),
             .mlp1_weight = Tensor(mlp1_weight.shape(), dt),
             .mlp1_bias = Tensor(mlp1_bias.shape(), dt),
             .mlp2_weight = Tensor(mlp2_weight.shape(), dt),
             .mlp2_bias = Tensor(mlp2_bias.shape(), dt)};
  const auto slots = group_slots(r, experts);
  const auto tm = t.matrix<S>();
  const auto gm = grad_out.matrix<S>();
  const S* route_w = r.weights.data<S>();
  S* grad_route_w = g.weights.data<S>();
  auto gt = g.t.matrix<S>();
  for (std::int64_t e = 0; e < experts; ++e) {
    const auto& rows = slots[e];
    const auto n = static_cast<Eigen::Index>(rows.size());
    if (n == 0) continue;
    RowMatrix<S> x(n, hidden), go(n, hidden);
    Eigen::Vector<S, Eigen::Dynamic> ws(n);
    for (Eigen::Index i = 0; i < n; ++i) {
      x.row(i) = tm.row(rows[i] / k);
      go.row(i) = gm.row(rows[i] / k);
      ws(i) = route_w[rows[i]];
    }
    const Map w1(mlp1_weight.data<S>() + e * two_i * hidden, two_i, hidden);
    const Map b1(mlp1_bias.data<S>() + e * two_i, 1, two_i);
    const Map w2(mlp2_weight.data<S>() + e * hidden * inter, hidden, inter);
    const Map b2(mlp2_bias.data<S>() + e * hidden, 1, hidden);
    RowMatrix<S> h = x * w1.transpose();
    h.rowwise() += b1.row(0);
    const RowMatrix<S> a = detail::swiglu_rows<S>(h, p.swiglu_alpha, p.swiglu_limit);
    const RowMatrix<S> y = a * w2.transpose();
    for (Eigen::Index i = 0; i < n; ++i) {
      grad_route_w[rows[i]] = go.row(i).dot(y.row(i) + b2.row(0));
    }
    const RowMatrix<S> dy = ws.asDiagonal() * go;
    g.mlp2_bias.matrix<S>().row(e) = dy.colwise().sum();
    Eigen::Map<RowMatrix<S>>(g.mlp2_weight.data<S>() + e * hidden * inter, hidden, inter) =
        dy.transpose() * a;
    const Tensor da = detail::to_tensor<S>(dy * w2, Shape{n, inter});
    const Tensor dh_t = swiglu_backward(detail::to_tensor<S>(h, Shape{n, two_i}), da,
                                        p.swiglu_alpha, p.swiglu_limit);
    const auto dh = dh_t.matrix<S>();
    g.mlp1_bias.matrix<S>().row(e) = dh.colwise().sum();
    Eigen::Map<RowMatrix<S>>(g.mlp1_weight.data<S>() + e * two_i * hidden, two_i, hidden) =
        dh.transpose() * x;
    const RowMatrix<S> dx = dh * w1;
    for (Eigen::Index i = 0; i < n; ++i) gt.row(rows[i] / k) += dx.row(i);
  }
  return g;
}

}  // namespace

MoeGrads moe_backward(const Tensor& t, const Routing& r, const Tensor& mlp1_weight,
                      const Tensor& mlp1_bias, const Tensor& mlp2_weight, const Tensor& mlp2_bias,
                      const Tensor& grad_out, const MoeParams& p) {
  perf::OpScope scope(kOp);
  scope.input(t).input(mlp1_weight).input(mlp1_bias).input(mlp2_weight).input(mlp2_bias);
  scope.input(grad_out).attr("k", r.k);
  check_inputs(t, r, mlp1_weight, mlp1_bias, mlp2_weight, mlp2_bias, grad_out);
  MoeGrads g = visit_real(t.dtype(), kOp, [&]<class S>(type_tag<S>) {
    return backward_impl<S>(t, r, mlp1_weight, mlp1_bias, mlp2_weight, mlp2_bias, grad_out, p);
  });
  // Per slot: the forward again (6 h I) and the backward GEMMs (12 h I), swiglu both ways.
  const double slots = static_cast<double>(r.num_tokens * r.k);
  const double h = static_cast<double>(t.shape()[1]);
  const double i = static_cast<double>(mlp1_weight.shape()[1] / 2);
  scope.output(g.t).flops(slots * (18.0 * h * i + 3.0 * kSwigluFlops * i));
  return g;
}

}  // namespace meshtest
