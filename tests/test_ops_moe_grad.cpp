// moe_backward against central finite differences in f64 of moe_combine(moe_experts(...)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/ops/moe/grad.hpp"
#include "src/ops/moe/moe.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_ops_moe_grad {

using test_support::expect_error;

// The inputs of one expert layer and the fixed routing.
struct Problem {
  Tensor t, w1, b1, w2, b2, grad_out;
  Routing r;
};

// T tokens, E experts, hidden H, intermediate I; token t's experts are `experts[t*k + j]`.
// Small weights (mlp1's scaled by 1/sqrt(H)) keep every swiglu input well inside the clamp.
Problem make_problem(std::int64_t T, std::int64_t E, std::int64_t H, std::int64_t I, std::int64_t k,
                     std::vector<std::int64_t> experts, std::uint64_t seed) {
  const auto normal = [&](Shape s, std::uint64_t stream, double std) {
    return random_normal(s, DType::f64, {.seed = seed, .stream = stream}, 0, std);
  };
  Problem p{.t = normal(Shape{T, H}, 0, 1),
            .w1 = normal(Shape{E, 2 * I, H}, 1, 1 / std::sqrt(static_cast<double>(H))),
            .b1 = normal(Shape{E, 2 * I}, 2, 0.5),
            .w2 = normal(Shape{E, H, I}, 3, 0.5),
            .b2 = normal(Shape{E, H}, 4, 0.5),
            .grad_out = normal(Shape{T, H}, 5, 1),
            .r = {}};
  p.r = Routing{
      .num_tokens = T,
      .k = k,
      .experts = std::move(experts),
      .weights = random_uniform(Shape{T, k}, DType::f64, {.seed = seed, .stream = 6}, 0.1, 1.0)};
  return p;
}

// Σ grad_out · moe_combine(moe_experts(...)): the loss whose gradients moe_backward returns.
double loss(const Problem& p) {
  const Tensor out = moe_combine(moe_experts(p.t, p.r, p.w1, p.b1, p.w2), p.r, p.b2);
  double sum = 0;
  for (std::int64_t i = 0; i < out.numel(); ++i) sum += p.grad_out.item(i) * out.item(i);
  return sum;
}

// The swiglu inputs of every slot, computed with loops (to keep finite differences off the
// clamp kinks): the smallest distance of x_glu to +limit and of |x_lin| to limit.
double distance_to_clamp(const Problem& p, double limit) {
  const std::int64_t H = p.t.shape()[1], two_i = p.w1.shape()[1];
  double m = INFINITY;
  for (std::int64_t s = 0; s < p.r.num_tokens * p.r.k; ++s) {
    const std::int64_t tok = s / p.r.k, e = p.r.experts[s];
    for (std::int64_t u = 0; u < two_i; ++u) {
      double h = p.b1.item(e * two_i + u);
      for (std::int64_t c = 0; c < H; ++c) {
        h += p.w1.item((e * two_i + u) * H + c) * p.t.item(tok * H + c);
      }
      m = std::min(m, std::abs((u % 2 == 0 ? h : std::abs(h)) - limit));
    }
  }
  return m;
}

// Every `stride`-th element of every input against a central difference of step h of loss().
// Its truncation error is ≈ (h·x)² |f'''/f'| / 6 relative to fd (x what the entry multiplies,
// e.g. t for mlp1_weight, |t| ≲ 4), its cancellation error ≈ u·√(T·H)·|L| / (2h) with loss()'s
// T·H terms: ≈ 1e-12 and 2e-9 at h = 1e-6, ≈ 3e-8 relative and 4e-9 at hidden 8192 with
// h = 1e-4. 1e-7 (1 + |fd|) is above both; only the cancellation depends on the processor.
void expect_matches_finite_differences(Problem p, const std::string& label, std::int64_t stride = 1,
                                       double h = 1e-6) {
  const MoeGrads g = moe_backward(p.t, p.r, p.w1, p.b1, p.w2, p.b2, p.grad_out);
  const std::vector<std::pair<std::string, std::pair<Tensor*, const Tensor*>>> inputs{
      {"t", {&p.t, &g.t}},
      {"weights", {&p.r.weights, &g.weights}},
      {"mlp1_weight", {&p.w1, &g.mlp1_weight}},
      {"mlp1_bias", {&p.b1, &g.mlp1_bias}},
      {"mlp2_weight", {&p.w2, &g.mlp2_weight}},
      {"mlp2_bias", {&p.b2, &g.mlp2_bias}}};
  for (const auto& [name, tensors] : inputs) {
    auto [x, grad] = tensors;
    ASSERT_EQ(grad->shape(), x->shape()) << label << " " << name;
    ASSERT_EQ(grad->dtype(), DType::f64) << label << " " << name;
    for (std::int64_t i = 0; i < x->numel(); i += stride) {
      double& v = x->span<double>()[i];
      const double saved = v;
      v = saved + h;
      const double up = loss(p);
      v = saved - h;
      const double down = loss(p);
      v = saved;
      const double fd = (up - down) / (2 * h);
      EXPECT_NEAR(grad->item(i), fd, 1e-7 * (1 + std::abs(fd)))
          << label << " d/d" << name << "[" << i << "]";
    }
  }
}

// The slots' experts for T tokens of k distinct experts each, cycling over `use`.
std::vector<std::int64_t> cycle(std::int64_t T, std::int64_t k,
                                const std::vector<std::int64_t>& use) {
  std::vector<std::int64_t> out;
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t j = 0; j < k; ++j) out.push_back(use[(t + j) % use.size()]);
  }
  return out;
}

TEST(MoeBackward, MatchesFiniteDifferencesForK1K2AndKE) {
  struct Case {
    std::int64_t T, E, H, I, k;
    std::vector<std::int64_t> use;  // the experts the routing cycles over
  };
  for (const Case& c : {Case{4, 3, 4, 3, 1, {0, 1, 2}}, Case{5, 4, 3, 2, 2, {0, 1, 2, 3}},
                        Case{3, 3, 5, 2, 3, {0, 1, 2}}, Case{1, 2, 6, 4, 2, {1, 0}},
                        Case{1, 4, 3, 3, 1, {2}}, Case{6, 2, 2, 1, 1, {1, 1, 0}}}) {
    const std::string label = fmt::format("T {} E {} H {} I {} k {}", c.T, c.E, c.H, c.I, c.k);
    const Problem p = make_problem(c.T, c.E, c.H, c.I, c.k, cycle(c.T, c.k, c.use), 61);
    ASSERT_GT(distance_to_clamp(p, kSwigluLimit), 1e-3) << label;
    expect_matches_finite_differences(p, label);
  }
}

TEST(MoeBackward, ExpertWithoutTokensHasZeroGradients) {
  // Expert 2 of 4 gets no slot: its weight and bias gradients are exactly zero.
  const Problem p = make_problem(5, 4, 4, 3, 2, cycle(5, 2, {0, 1, 3}), 62);
  expect_matches_finite_differences(p, "expert 2 idle");
  const MoeGrads g = moe_backward(p.t, p.r, p.w1, p.b1, p.w2, p.b2, p.grad_out);
  const auto expect_zero = [](const Tensor& grad, std::int64_t e, const char* name) {
    const Tensor part = grad.slice(0, e, 1);
    bool any_other = false;
    for (std::int64_t i = 0; i < part.numel(); ++i) EXPECT_EQ(part.item(i), 0.0) << name << i;
    for (std::int64_t i = 0; i < grad.numel(); ++i) any_other = any_other || grad.item(i) != 0;
    EXPECT_TRUE(any_other) << name << ": the used experts have gradients";
  };
  expect_zero(g.mlp1_weight, 2, "mlp1_weight");
  expect_zero(g.mlp1_bias, 2, "mlp1_bias");
  expect_zero(g.mlp2_weight, 2, "mlp2_weight");
  expect_zero(g.mlp2_bias, 2, "mlp2_bias");
}

TEST(MoeBackward, LargeHiddenTwoTokens) {
  // hidden 8192: every 997th element of each input against its central difference, with a
  // larger step (the loss sums 16384 terms, so its rounding over 2h is larger).
  const Problem p = make_problem(2, 3, 8192, 2, 2, {2, 0, 1, 2}, 67);
  ASSERT_GT(distance_to_clamp(p, kSwigluLimit), 1e-3);
  expect_matches_finite_differences(p, "hidden 8192", 997, 1e-4);
}

TEST(MoeBackward, NoTokens) {
  const Problem p = make_problem(0, 3, 4, 2, 2, {}, 63);
  const MoeGrads g = moe_backward(p.t, p.r, p.w1, p.b1, p.w2, p.b2, p.grad_out);
  EXPECT_EQ(g.t.shape(), (Shape{0, 4}));
  EXPECT_EQ(g.weights.shape(), (Shape{0, 2}));
  for (const Tensor* w : {&g.mlp1_weight, &g.mlp1_bias, &g.mlp2_weight, &g.mlp2_bias}) {
    for (std::int64_t i = 0; i < w->numel(); ++i) ASSERT_EQ(w->item(i), 0.0);
  }
  EXPECT_EQ(g.mlp1_weight.shape(), p.w1.shape());
  EXPECT_EQ(g.mlp2_bias.shape(), p.b2.shape());
}

TEST(MoeBackward, ClampedUnitsPassNoGradient) {
  // One token to expert 0; its unit 0 gets a glu input far above the limit and unit 1 a linear
  // input far below -limit, through the biases.
  Problem p = make_problem(1, 2, 3, 2, 1, {0}, 64);
  p.b1.span<double>()[0] = 40;   // x_glu of unit 0
  p.b1.span<double>()[3] = -40;  // x_lin of unit 1
  expect_matches_finite_differences(p, "clamped");
  const MoeGrads g = moe_backward(p.t, p.r, p.w1, p.b1, p.w2, p.b2, p.grad_out);
  EXPECT_EQ(g.mlp1_bias.item(0), 0.0);
  EXPECT_EQ(g.mlp1_bias.item(3), 0.0);
  EXPECT_NE(g.mlp1_bias.item(1), 0.0);  // unit 0's linear input still passes
  EXPECT_NE(g.mlp1_bias.item(2), 0.0);
  for (std::int64_t c = 0; c < 3; ++c) {
    EXPECT_EQ(g.mlp1_weight.item(0 * 3 + c), 0.0) << c;  // row 0 (glu of unit 0)
    EXPECT_EQ(g.mlp1_weight.item(3 * 3 + c), 0.0) << c;  // row 3 (lin of unit 1)
  }
}

TEST(MoeBackward, F32FollowsF64) {
  const std::int64_t T = 7, E = 4, H = 8, I = 6, k = 2;
  const Problem p = make_problem(T, E, H, I, k, cycle(T, k, {3, 0, 1, 2, 0}), 65);
  const auto f = [](const Tensor& x) { return x.astype(DType::f32); };
  Routing r32 = p.r;
  r32.weights = f(p.r.weights);
  const MoeGrads g32 = moe_backward(f(p.t), r32, f(p.w1), f(p.b1), f(p.w2), f(p.b2), f(p.grad_out));
  // The reference: the f64 backward of the same (f32-rounded) inputs.
  const auto same = [&](const Tensor& x) { return f(x).astype(DType::f64); };
  Routing r64 = p.r;
  r64.weights = same(p.r.weights);
  const MoeGrads g64 = moe_backward(same(p.t), r64, same(p.w1), same(p.b1), same(p.w2), same(p.b2),
                                    same(p.grad_out));
  // Per element, the chain of sums behind a gradient: the forward's mlp1 over H and mlp2 over
  // I (and their biases), the backward's products with mlp2 over H and with mlp1 over 2I, and
  // the sums over the T tokens and the k slots.
  const ErrorModel m{.dtype = DType::f32,
                     .terms = (H + 1) + (I + 1) + H + 2 * I + T + k,
                     .reference = Reference::exact};
  struct Grad {
    const char* name;
    const Tensor* want;
    const Tensor* got;
  };
  for (const Grad& g : {Grad{"t", &g64.t, &g32.t}, Grad{"weights", &g64.weights, &g32.weights},
                        Grad{"mlp1_weight", &g64.mlp1_weight, &g32.mlp1_weight},
                        Grad{"mlp1_bias", &g64.mlp1_bias, &g32.mlp1_bias},
                        Grad{"mlp2_weight", &g64.mlp2_weight, &g32.mlp2_weight},
                        Grad{"mlp2_bias", &g64.mlp2_bias, &g32.mlp2_bias}}) {
    ASSERT_EQ(g.got->dtype(), DType::f32) << g.name;
    ASSERT_EQ(g.got->shape(), g.want->shape()) << g.name;
    const Comparison c = compare(*g.want, *g.got, m);
    EXPECT_TRUE(c.passed) << g.name << ": " << c;
  }
}

TEST(MoeBackward, BadInputThrows) {
  const Problem p = make_problem(3, 3, 4, 2, 2, cycle(3, 2, {0, 1, 2}), 66);
  const auto run = [&](const Problem& q) {
    moe_backward(q.t, q.r, q.w1, q.b1, q.w2, q.b2, q.grad_out);
  };
  Problem q = p;
  q.grad_out = Tensor(Shape{3, 5}, DType::f64);
  expect_error([&] { run(q); }, {"moe_backward", "grad_out", "[3, 5]", "[3, 4]"});
  q = p;
  q.b2 = Tensor(Shape{2, 4}, DType::f64);
  expect_error([&] { run(q); }, {"moe_backward", "mlp2_bias"});
  q = p;
  q.b1 = Tensor(Shape{3, 5}, DType::f64);
  expect_error([&] { run(q); }, {"moe_backward", "mlp1_bias"});
  q = p;
  q.w2 = Tensor(Shape{3, 4, 3}, DType::f64);
  expect_error([&] { run(q); }, {"moe_backward", "mlp2_weight"});
  q = p;
  q.w1 = Tensor(Shape{3, 3, 4}, DType::f64);
  expect_error([&] { run(q); }, {"moe_backward", "mlp1_weight", "even"});
  q = p;
  q.t = Tensor(Shape{3, 5}, DType::f64);
  expect_error([&] { run(q); }, {"moe_backward", "mlp1_weight"});
  q = p;
  q.w2 = q.w2.astype(DType::f32);
  expect_error([&] { run(q); }, {"moe_backward", "mlp2_weight", "dtype f32", "f64"});
  q = p;
  q.r.weights = q.r.weights.astype(DType::f32);
  expect_error([&] { run(q); }, {"moe_backward", "routing.weights", "dtype"});
  q = p;
  q.r.weights = Tensor(Shape{3, 1}, DType::f64);
  expect_error([&] { run(q); }, {"moe_backward", "routing.weights"});
  q = p;
  q.r.experts[4] = 3;
  expect_error([&] { run(q); }, {"expert 3", "[0, 3)"});
  q = p;
  q.r.experts.pop_back();
  expect_error([&] { run(q); }, {"moe_backward", "routing"});
  q = p;
  for (Tensor* x : {&q.t, &q.w1, &q.b1, &q.w2, &q.b2, &q.grad_out, &q.r.weights}) {
    *x = x->astype(DType::bf16);
  }
  expect_error([&] { run(q); }, {"moe_backward", "bf16"});
}

}  // namespace test_ops_moe_grad
}  // namespace meshtest
