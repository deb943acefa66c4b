// moe/gating: gate() picks the experts with route_top_k (one selection rule for both orders)
// and weighs them by the order's softmax; router_probabilities is the full-row softmax.
#include "src/ops/moe/gating.hpp"

#include <cmath>

#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

using detail::compute_t;
using detail::ComputeMatrix;

// Softmax of every row in the compute type C (f64 for f64, f32 otherwise).
template <class S>
RowMatrix<compute_t<S>> softmax_rows(const Tensor& logits) {
  const ComputeMatrix<S> g(logits);
  RowMatrix<compute_t<S>> p(g.map().rows(), g.map().cols());
  for (Eigen::Index t = 0; t < p.rows(); ++t) {
    p.row(t) = (g.map().row(t).array() - g.map().row(t).maxCoeff()).exp();
    p.row(t) /= p.row(t).sum();
  }
  return p;
}

// SoftmaxThenTopK: the full-row probabilities of the chosen experts, renormalised over the k
// when asked, rounded once to S.
template <class S>
Tensor softmax_weights(const Tensor& logits, const Routing& r, bool renormalize) {
  using C = compute_t<S>;
  const RowMatrix<C> p = softmax_rows<S>(logits);
  RowMatrix<C> w(r.num_tokens, r.k);
  for (std::int64_t t = 0; t < r.num_tokens; ++t) {
    for (std::int64_t j = 0; j < r.k; ++j) w(t, j) = p(t, r.experts[t * r.k + j]);
    if (renormalize) w.row(t) /= w.row(t).sum();
  }
  return detail::to_tensor<S>(w, Shape{r.num_tokens, r.k});
}

void check_logits(std::string_view op, const Tensor& logits) {
  detail::check_rank(op, "logits ([T, experts])", logits, 2);
  MESHTEST_CHECK(is_floating(logits.dtype()),
                 "{}: dtype {} is not supported (expected f32, "
                 "f64 or bf16)",
                 op, logits.dtype());
  const std::int64_t experts = logits.shape()[1];
  for (std::int64_t i = 0; i < logits.numel(); ++i) {
    MESHTEST_CHECK(!std::isnan(logits.item(i)), "{}: logit of token {}, expert {} is NaN", op,
                   i / experts, i % experts);
  }
}

}  // namespace

Routing gate(const Tensor& logits, std::int64_t k, const GatingOptions& o) {
  constexpr std::string_view op = "gate";
  perf::OpScope scope(op);
  scope.input(logits).attr("k", k);
  check_logits(op, logits);
  MESHTEST_CHECK(k >= 1 && k <= logits.shape()[1],
                 "gate: k is {}, expected 1 .. {} (the number of experts)", k, logits.shape()[1]);
  // The selection (and, for TopKThenSoftmax, the weights) is route_top_k's.
  Routing r = route_top_k(logits, k);
  if (o.order == GatingOrder::SoftmaxThenTopK) {
    scope.attr("renormalize", o.renormalize);
    r.weights = detail::visit_floating(logits.dtype(), op, [&]<class S>(type_tag<S>) {
      return softmax_weights<S>(logits, r, o.renormalize);
    });
  }
  scope.attr("order", o.order == GatingOrder::TopKThenSoftmax ? "topk_softmax" : "softmax_topk");
  scope.output(r.weights).flops(static_cast<double>(logits.numel()));
  return r;
}

Tensor router_probabilities(const Tensor& logits) {
  constexpr std::string_view op = "router_probabilities";
  perf::OpScope scope(op);
  scope.input(logits);
  check_logits(op, logits);
  Tensor p = detail::visit_floating(logits.dtype(), op, [&]<class S>(type_tag<S>) {
    using C = compute_t<S>;
    return detail::to_tensor<C>(softmax_rows<S>(logits), logits.shape());
  });
  scope.output(p).flops(3.0 * static_cast<double>(logits.numel()));
  return p;
}

}  // namespace meshtest
