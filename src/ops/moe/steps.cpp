// moe/steps: the router (top-k, softmax over the k), the experts grouped per expert with swiglu,
// and the weighted combine.
#include "src/ops/moe/steps.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

using detail::compute_t;
using detail::ComputeMatrix;
using detail::round_all;

void check_routing(std::string_view op, const Routing& r, std::int64_t tokens, std::int64_t experts,
                   DType dtype) {
  MESHTEST_CHECK(r.num_tokens == tokens && r.k >= 1 &&
                     static_cast<std::int64_t>(r.experts.size()) == tokens * r.k,
                 "{}: routing is for {} tokens x k {} ({} experts listed), expected {} tokens", op,
                 r.num_tokens, r.k, r.experts.size(), tokens);
  detail::check_shape(op, "routing.weights", r.weights, Shape{tokens, r.k});
  detail::check_dtype(op, "routing.weights", r.weights, dtype);
  for (const std::int64_t e : r.experts) {
    MESHTEST_CHECK(e >= 0 && e < experts, "{}: routing names expert {}, expected [0, {})", op, e,
                   experts);
  }
}

template <class S>
Routing route_impl(const Tensor& logits, std::int64_t k) {
  using C = compute_t<S>;
  const ComputeMatrix<S> g(logits);
  const Eigen::Index tokens = g.map().rows();
  const Eigen::Index experts = g.map().cols();
  Routing r{.num_tokens = tokens, .k = k, .experts = {}, .weights = {}};
  r.experts.reserve(static_cast<std::size_t>(tokens * k));
  RowMatrix<C> w(tokens, k);
  std::vector<std::int64_t> order(static_cast<std::size_t>(experts));
  for (Eigen::Index t = 0; t < tokens; ++t) {
    const auto row = g.map().row(t);
    for (Eigen::Index e = 0; e < experts; ++e) {
      MESHTEST_CHECK(!std::isnan(row(e)), "route_top_k: gate logit of token {}, expert {} is NaN",
                     t, e);
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](std::int64_t a, std::int64_t b) {
                        return row(a) > row(b) || (row(a) == row(b) && a < b);
                      });
    const C max = row(order[0]);
    C sum = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      r.experts.push_back(order[j]);
      w(t, j) = std::exp(row(order[j]) - max);
      sum += w(t, j);
    }
    w.row(t) /= sum;
  }
  r.weights = detail::to_tensor<S>(w, Shape{tokens, k});
  return r;
}

template <class S>
Tensor experts_impl(const Tensor& t, const Routing& r, const Tensor& mlp1_weight,
                    const Tensor& mlp1_bias, const Tensor& mlp2_weight, const MoeParams& p) {
  using C = compute_t<S>;
  const std::int64_t experts = mlp1_weight.shape()[0];
  const std::int64_t two_i = mlp1_weight.shape()[1];
  const std::int64_t hidden = mlp1_weight.shape()[2];
  const std::int64_t inter = two_i / 2;
  // Slots (t * k + j) grouped by expert, ascending within an expert.
  std::vector<std::vector<std::int64_t>> slots(static_cast<std::size_t>(experts));
  for (std::size_t s = 0; s < r.experts.size(); ++s) {
    slots[r.experts[s]].push_back(static_cast<std::int64_t>(s));
  }
  const ComputeMatrix<S> tm(t);
  RowMatrix<C> out = RowMatrix<C>::Zero(r.num_tokens * r.k, hidden);
  for (std::int64_t e = 0; e < experts; ++e) {
    const auto& rows = slots[e];
    if (rows.empty()) continue;
    const auto n = static_cast<Eigen::Index>(rows.size());
    RowMatrix<C> xe(n, hidden);
    for (Eigen::Index i = 0; i < n; ++i) xe.row(i) = tm.map().row(rows[i] / r.k);
    const ComputeMatrix<S> w1(mlp1_weight, e * two_i * hidden, two_i, hidden);
    const ComputeMatrix<S> b1(mlp1_bias, e * two_i, 1, two_i);
    RowMatrix<C> h(n, two_i);
    h.noalias() = xe * w1.map().transpose();
    round_all<S>(h);
    h.rowwise() += b1.map().row(0);
    round_all<S>(h);
    const RowMatrix<C> a = detail::swiglu_rows<S>(h, p.swiglu_alpha, p.swiglu_limit);
    const ComputeMatrix<S> w2(mlp2_weight, e * hidden * inter, hidden, inter);
    RowMatrix<C> y(n, hidden);
    y.noalias() = a * w2.map().transpose();
    round_all<S>(y);
    for (Eigen::Index i = 0; i < n; ++i) out.row(rows[i]) = y.row(i);
  }
  return detail::to_tensor<S>(out, Shape{r.num_tokens, r.k, hidden});
}

template <class S>
Tensor combine_impl(const Tensor& y, const Routing& r, const Tensor& mlp2_bias) {
  using C = compute_t<S>;
  const std::int64_t hidden = y.shape()[2];
  const ComputeMatrix<S> ym(y, 0, r.num_tokens * r.k, hidden);
  const ComputeMatrix<S> bias(mlp2_bias);
  const ComputeMatrix<S> w(r.weights);
  RowMatrix<C> out = RowMatrix<C>::Zero(r.num_tokens, hidden);
  RowMatrix<C> biased(1, hidden);
  for (std::int64_t t = 0; t < r.num_tokens; ++t) {
    for (std::int64_t j = 0; j < r.k; ++j) {
      const std::int64_t s = t * r.k + j;
      biased = ym.map().row(s) + bias.map().row(r.experts[s]);
      round_all<S>(biased);
      out.row(t) += w.map()(t, j) * biased;
    }
  }
  round_all<S>(out);
  return detail::to_tensor<S>(out, Shape{r.num_tokens, hidden});
}

}  // namespace

void check_moe_weights(std::string_view op, const Tensor& gate_weight, const Tensor& gate_bias,
                       const Tensor& mlp1_weight, const Tensor& mlp1_bias,
                       const Tensor& mlp2_weight, const Tensor& mlp2_bias, const MoeParams& p,
                       std::int64_t hidden, DType dtype, bool mlp2_bias_optional) {
  detail::check_rank(op, "gate.weight ([experts, hidden])", gate_weight, 2);
  detail::check_rank(op, "mlp2_weight ([experts, hidden, intermediate])", mlp2_weight, 3);
  const std::int64_t experts = gate_weight.shape()[0];
  const std::int64_t inter = mlp2_weight.shape()[2];
  MESHTEST_CHECK(p.experts_per_token >= 1 && p.experts_per_token <= experts,
                 "{}: experts_per_token is {}, expected 1 .. {} (the number of experts)", op,
                 p.experts_per_token, experts);
  const bool bias = !(mlp2_bias_optional && detail::is_unset(mlp2_bias));
  detail::check_shape(op, "gate.weight", gate_weight, Shape{experts, hidden});
  detail::check_shape(op, "gate.bias", gate_bias, Shape{experts});
  detail::check_shape(op, "mlp1_weight", mlp1_weight, Shape{experts, 2 * inter, hidden});
  detail::check_shape(op, "mlp1_bias", mlp1_bias, Shape{experts, 2 * inter});
  detail::check_shape(op, "mlp2_weight", mlp2_weight, Shape{experts, hidden, inter});
  if (bias) detail::check_shape(op, "mlp2_bias", mlp2_bias, Shape{experts, hidden});
  detail::check_dtype(op, "gate.weight", gate_weight, dtype);
  detail::check_dtype(op, "gate.bias", gate_bias, dtype);
  detail::check_dtype(op, "mlp1_weight", mlp1_weight, dtype);
  detail::check_dtype(op, "mlp1_bias", mlp1_bias, dtype);
  detail::check_dtype(op, "mlp2_weight", mlp2_weight, dtype);
  if (bias) detail::check_dtype(op, "mlp2_bias", mlp2_bias, dtype);
}

Routing route_top_k(const Tensor& logits, std::int64_t k) {
  perf::OpScope scope("route_top_k");
  scope.input(logits).attr("k", k);
  detail::check_rank("route_top_k", "logits ([T, experts])", logits, 2);
  MESHTEST_CHECK(k >= 1 && k <= logits.shape()[1],
                 "route_top_k: k is {}, expected 1 .. {} (the number of experts)", k,
                 logits.shape()[1]);
  Routing r = detail::visit_floating(logits.dtype(), "route_top_k", [&]<class S>(type_tag<S>) {
    return route_impl<S>(logits, k);
  });
  scope.output(r.weights).flops(static_cast<double>(logits.numel()));
  return r;
}

Tensor moe_experts(const Tensor& t, const Routing& routing, const Tensor& mlp1_weight,
                   const Tensor& mlp1_bias, const Tensor& mlp2_weight, const MoeParams& p) {
  constexpr std::string_view op = "moe_experts";
  perf::OpScope scope(op);
  scope.input(t).input(mlp1_weight).input(mlp1_bias).input(mlp2_weight).attr("k", routing.k);
  detail::check_rank(op, "t ([T, hidden])", t, 2);
  detail::check_rank(op, "mlp1_weight ([experts, 2I, hidden])", mlp1_weight, 3);
  const std::int64_t experts = mlp1_weight.shape()[0];
  const std::int64_t two_i = mlp1_weight.shape()[1];
  const std::int64_t hidden = t.shape()[1];
  MESHTEST_CHECK(two_i % 2 == 0, "moe_experts: mlp1_weight has shape {}; its dim 1 must be even",
                 mlp1_weight.shape());
  detail::check_shape(op, "mlp1_weight", mlp1_weight, Shape{experts, two_i, hidden});
  detail::check_shape(op, "mlp1_bias", mlp1_bias, Shape{experts, two_i});
  detail::check_shape(op, "mlp2_weight", mlp2_weight, Shape{experts, hidden, two_i / 2});
  for (const Tensor* w : {&mlp1_weight, &mlp1_bias, &mlp2_weight}) {
    detail::check_dtype(op, "expert weight", *w, t.dtype());
  }
  check_routing(op, routing, t.shape()[0], experts, t.dtype());
  Tensor y = detail::visit_floating(t.dtype(), op, [&]<class S>(type_tag<S>) {
    return experts_impl<S>(t, routing, mlp1_weight, mlp1_bias, mlp2_weight, p);
  });
  // Per (token, expert) slot: mlp1 (2 * hidden * 2I), bias, swiglu, mlp2 (2 * I * hidden).
  const double slots = static_cast<double>(routing.num_tokens * routing.k);
  const double h = static_cast<double>(hidden), i = static_cast<double>(two_i / 2);
  scope.output(y).flops(slots * (6.0 * h * i + 2.0 * i + kSwigluFlops * i));
  return y;
}

Tensor moe_combine(const Tensor& y, const Routing& routing, const Tensor& mlp2_bias) {
  constexpr std::string_view op = "moe_combine";
  perf::OpScope scope(op);
  scope.input(y).input(mlp2_bias).attr("k", routing.k);
  detail::check_rank(op, "y ([T, k, hidden])", y, 3);
  detail::check_rank(op, "mlp2_bias ([experts, hidden])", mlp2_bias, 2);
  detail::check_shape(op, "y", y, Shape{routing.num_tokens, routing.k, y.shape()[2]});
  detail::check_shape(op, "mlp2_bias", mlp2_bias, Shape{mlp2_bias.shape()[0], y.shape()[2]});
  detail::check_dtype(op, "mlp2_bias", mlp2_bias, y.dtype());
  check_routing(op, routing, y.shape()[0], mlp2_bias.shape()[0], y.dtype());
  Tensor out = detail::visit_floating(
      y.dtype(), op, [&]<class S>(type_tag<S>) { return combine_impl<S>(y, routing, mlp2_bias); });
  scope.output(out).flops(3.0 * static_cast<double>(y.numel()));
  return out;
}

}  // namespace meshtest
