// moe/grad: the routed experts' backward on rows grouped by expert (permute, grouped GEMMs).
#include "src/ops/moe/grad.hpp"

#include <string_view>
#include <utility>

#include "src/ops/compute.hpp"
#include "src/ops/moe/grouped_gemm.hpp"
#include "src/ops/moe/permute.hpp"
#include "src/ops/swiglu_grad.hpp"
#include "src/ops/visit_real.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

constexpr std::string_view kOp = "moe_backward";

void check_inputs(const Tensor& t, const Routing& r, const Tensor& mlp1_weight,
                  const Tensor& mlp1_bias, const Tensor& mlp2_weight, const Tensor& mlp2_bias,
                  const Tensor& grad_out) {
  MESHTEST_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64,
                 "moe_backward: dtype {} is not supported (expected f32 or f64)", t.dtype());
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

// For every permuted row i of expert e (slot s = perm.slots[i]), from grad_rows[i] (grad_out
// of the row's token) and y[i] (the expert's output without its bias):
//   grad_weights[s] = grad_rows[i] · (y[i] + b2[e]),   dy[i] = weights[s] · grad_rows[i].
template <class S>
void slot_terms(const Permutation& perm, const Tensor& weights, const Tensor& grad_rows,
                const Tensor& y, const Tensor& mlp2_bias, Tensor& grad_weights, Tensor& dy) {
  const auto g = grad_rows.matrix<S>();
  const auto ym = y.matrix<S>();
  const auto b2 = mlp2_bias.matrix<S>();
  auto dym = dy.matrix<S>();
  const S* w = weights.data<S>();
  S* gw = grad_weights.data<S>();
  for (std::int64_t e = 0; e < perm.num_experts; ++e) {
    for (std::int64_t i = perm.offsets[e]; i < perm.offsets[e + 1]; ++i) {
      const std::int64_t s = perm.slots[i];
      gw[s] = g.row(i).dot(ym.row(i) + b2.row(e));
      dym.row(i) = w[s] * g.row(i);
    }
  }
}

}  // namespace

MoeGrads moe_backward(const Tensor& t, const Routing& r, const Tensor& mlp1_weight,
                      const Tensor& mlp1_bias, const Tensor& mlp2_weight, const Tensor& mlp2_bias,
                      const Tensor& grad_out, const MoeParams& p) {
  perf::OpScope scope(kOp);
  scope.input(t).input(mlp1_weight).input(mlp1_bias).input(mlp2_weight).input(mlp2_bias);
  scope.input(grad_out).attr("k", r.k);
  check_inputs(t, r, mlp1_weight, mlp1_bias, mlp2_weight, mlp2_bias, grad_out);
  const Permutation perm = make_permutation(r, mlp1_weight.shape()[0]);
  // The forward again on the rows grouped by expert: h = W1 x + b1, a = swiglu(h), y = W2 a.
  const Tensor x = permute(t, perm);
  const Tensor h = grouped_gemm(x, perm.offsets, mlp1_weight, mlp1_bias);
  const Tensor a = swiglu(h, p.swiglu_alpha, p.swiglu_limit);
  const Tensor y = grouped_gemm(a, perm.offsets, mlp2_weight);
  Tensor grad_weights(r.weights.shape(), t.dtype());  // zero where a slot has no row
  Tensor dy(y.shape(), t.dtype(), Tensor::Uninitialized{});
  visit_real(t.dtype(), kOp, [&]<class S>(type_tag<S>) {
    slot_terms<S>(perm, r.weights, permute(grad_out, perm), y, mlp2_bias, grad_weights, dy);
  });
  GroupedGemmGrads g2 = grouped_gemm_backward(a, perm.offsets, mlp2_weight, dy);
  const Tensor dh = swiglu_backward(h, g2.x, p.swiglu_alpha, p.swiglu_limit);
  GroupedGemmGrads g1 = grouped_gemm_backward(x, perm.offsets, mlp1_weight, dh);
  // Each token's rows summed back: unpermute with unit weights.
  Tensor ones(r.weights.shape(), t.dtype());
  ones.fill(1.0);
  MoeGrads g{.t = unpermute(g1.x, perm, ones),
             .weights = std::move(grad_weights),
             .mlp1_weight = std::move(g1.w),
             .mlp1_bias = std::move(g1.bias),
             .mlp2_weight = std::move(g2.w),
             .mlp2_bias = std::move(g2.bias)};
  // Per slot: the forward again (6 h I) and the backward GEMMs (12 h I), swiglu both ways.
  const double slots = static_cast<double>(r.num_tokens * r.k);
  const double hidden = static_cast<double>(t.shape()[1]);
  const double inter = static_cast<double>(mlp1_weight.shape()[1] / 2);
  scope.output(g.t).flops(slots * (18.0 * hidden * inter + 3.0 * kSwigluFlops * inter));
  return g;
}

}  // namespace meshtest
