// The router in both gating orders and the router probabilities against loops in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/ops/moe/gating.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_ops_moe_gating {

using test_support::expect_error;
using Ids = std::vector<std::int64_t>;

struct RefRouting {
  Ids experts;
  std::vector<double> weights;
};

// Selection sort per row: the largest remaining logit, the lower expert on ties; weights in
// double by the gating order.
RefRouting reference_gate(const Tensor& logits, std::int64_t k, GatingOrder order,
                          bool renormalize) {
  const std::int64_t t_count = logits.shape()[0], e_count = logits.shape()[1];
  RefRouting r;
  for (std::int64_t t = 0; t < t_count; ++t) {
    const auto l = [&](std::int64_t e) { return logits.item(t * e_count + e); };
    std::vector<bool> taken(static_cast<std::size_t>(e_count), false);
    Ids chosen;
    for (std::int64_t j = 0; j < k; ++j) {
      std::int64_t best = -1;
      for (std::int64_t e = 0; e < e_count; ++e) {
        if (!taken[e] && (best < 0 || l(e) > l(best))) best = e;
      }
      taken[best] = true;
      chosen.push_back(best);
    }
    double max = l(0);
    for (std::int64_t e = 1; e < e_count; ++e) max = std::max(max, l(e));
    double all = 0, top = 0;
    for (std::int64_t e = 0; e < e_count; ++e) all += std::exp(l(e) - max);
    for (const std::int64_t e : chosen) top += std::exp(l(e) - max);
    for (const std::int64_t e : chosen) {
      const double z = order == GatingOrder::TopKThenSoftmax || renormalize ? top : all;
      r.experts.push_back(e);
      r.weights.push_back(std::exp(l(e) - max) / z);
    }
  }
  return r;
}

void expect_routing(const Routing& got, const RefRouting& want, std::int64_t k,
                    const ErrorModel& m) {
  EXPECT_EQ(got.k, k);
  EXPECT_EQ(got.experts, want.experts);
  ASSERT_EQ(got.weights.shape(), (Shape{got.num_tokens, k}));
  const Comparison c =
      compare(Tensor::from_vector(got.weights.shape(), want.weights), got.weights, m);
  EXPECT_TRUE(c.passed) << c;
}

const GatingOptions kTopK{.order = GatingOrder::TopKThenSoftmax};
const GatingOptions kSoftmax{.order = GatingOrder::SoftmaxThenTopK, .renormalize = false};
const GatingOptions kSoftmaxRenorm{.order = GatingOrder::SoftmaxThenTopK, .renormalize = true};

TEST(Gate, BothOrdersMatchTheLoops) {
  const std::int64_t t_count = 9, e_count = 6;
  const Tensor logits = random_normal(Shape{t_count, e_count}, DType::f64, {.seed = 31}, 0, 3);
  const Tensor logits32 = logits.astype(DType::f32);
  for (const std::int64_t k : {1, 2, 4, 6}) {
    // A softmax over at most E logits, renormalised by a sum over k: f64 against the loops in
    // another order, f32 against the loops in f64 on the same (f32) logits.
    const ErrorModel m64{
        .dtype = DType::f64, .terms = e_count + k, .reference = Reference::other_order};
    const ErrorModel m32{.dtype = DType::f32, .terms = e_count + k, .reference = Reference::exact};
    for (const GatingOptions& o : {kTopK, kSoftmax, kSoftmaxRenorm}) {
      SCOPED_TRACE(testing::Message() << "k " << k << " order " << static_cast<int>(o.order)
                                      << " renormalize " << o.renormalize);
      expect_routing(gate(logits, k, o), reference_gate(logits, k, o.order, o.renormalize), k, m64);
      expect_routing(gate(logits32, k, o), reference_gate(logits32, k, o.order, o.renormalize), k,
                     m32);
    }
  }
  // k = E: the un-renormalised weights are the full softmax and sum to 1 (the closed form):
  // the softmax's E-term sum, then the test's.
  const ErrorModel one{.dtype = DType::f64, .terms = 2 * e_count, .reference = Reference::exact};
  const Routing all = gate(logits, e_count, kSoftmax);
  for (std::int64_t t = 0; t < t_count; ++t) {
    double s = 0;
    for (std::int64_t j = 0; j < e_count; ++j) s += all.weights.item(t * e_count + j);
    EXPECT_NEAR(s, 1.0, error_bound(one, 1.0, 1.0)) << "token " << t;
  }
}

TEST(Gate, TopKThenSoftmaxIsRouteTopKBitForBit) {
  for (const DType dt : {DType::f32, DType::f64, DType::bf16}) {
    const Tensor logits = random_normal(Shape{17, 8}, dt, {.seed = 32});
    for (const std::int64_t k : {1, 3, 8}) {
      const Routing a = gate(logits, k);
      const Routing b = route_top_k(logits, k);
      EXPECT_EQ(a.experts, b.experts);
      EXPECT_TRUE(a.weights.bitwise_equal(b.weights)) << "k " << k;
      EXPECT_EQ(a.weights.dtype(), dt);
    }
  }
}

TEST(Gate, TiesGoToTheLowerExpert) {
  const Tensor logits = Tensor::from_vector(Shape{2, 5}, std::vector<double>{1, 3, 3, 2, 3,  //
                                                                             4, 4, 4, 4, 4});
  // Softmaxes of at most 5 terms of one sign: 1e-15 is 18 ulps of 1/3 and 0.29, 36 of 0.2.
  for (const GatingOptions& o : {kTopK, kSoftmax, kSoftmaxRenorm}) {
    const Routing r = gate(logits, 3, o);
    EXPECT_EQ(r.experts, (Ids{1, 2, 4, 0, 1, 2}));
    const double w = o.order == GatingOrder::SoftmaxThenTopK && !o.renormalize
                         ? 1 / (3 + std::exp(-1.0) + std::exp(-2.0))
                         : 1.0 / 3;
    EXPECT_NEAR(r.weights.item(0), w, 1e-15);
    EXPECT_NEAR(r.weights.item(3),
                o.renormalize || o.order == GatingOrder::TopKThenSoftmax ? 1.0 / 3 : 0.2, 1e-15);
  }
}

TEST(Gate, EdgeSizesAndLargeLogits) {
  // T = 0: an empty routing in both orders.
  for (const GatingOptions& o : {kTopK, kSoftmax}) {
    const Routing r = gate(Tensor(Shape{0, 4}, DType::f32), 2, o);
    EXPECT_EQ(r.num_tokens, 0);
    EXPECT_TRUE(r.experts.empty());
    EXPECT_EQ(r.weights.shape(), (Shape{0, 2}));
  }
  // One token, one expert: weight 1.
  const Routing one = gate(Tensor::from_vector(Shape{1, 1}, std::vector<float>{-3}), 1, kSoftmax);
  EXPECT_EQ(one.experts, (Ids{0}));
  EXPECT_EQ(one.weights.item(0), 1.0);
  // Logits of 1000 do not overflow: softmax of (1000, 999, -1000). A few exp and a 3-term sum:
  // 1e-15 is 9 ulps of 0.73 and 18 of 0.27.
  const Tensor big = Tensor::from_vector(Shape{1, 3}, std::vector<double>{999, 1000, -1000});
  const Routing r = gate(big, 2, kSoftmax);
  EXPECT_EQ(r.experts, (Ids{1, 0}));
  EXPECT_NEAR(r.weights.item(0), 1 / (1 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(r.weights.item(1), std::exp(-1.0) / (1 + std::exp(-1.0)), 1e-15);
}

TEST(Gate, Bf16FollowsF32) {
  const Tensor logits = random_normal(Shape{12, 8}, DType::bf16, {.seed = 33}, 0, 2);
  for (const GatingOptions& o : {kTopK, kSoftmax, kSoftmaxRenorm}) {
    const Routing r16 = gate(logits, 3, o);
    const Routing r32 = gate(logits.astype(DType::f32), 3, o);
    EXPECT_EQ(r16.weights.dtype(), DType::bf16);
    EXPECT_EQ(r16.experts, r32.experts);  // the same (bf16) logits choose the same experts
    // One rounding to bf16 (u |w| = half a bf16 ulp or less) of f32 weights that may differ
    // from the f32 path's by the order of their E-term sums.
    const ErrorModel m{
        .dtype = DType::bf16, .terms = 2 * logits.shape()[1], .reference = Reference::exact};
    for (std::int64_t i = 0; i < r16.weights.numel(); ++i) {
      const double w32 = r32.weights.item(i);
      EXPECT_NEAR(r16.weights.item(i), w32, error_bound(m, std::abs(w32), w32)) << i;
    }
  }
}

TEST(Gate, BadInputThrows) {
  const Tensor logits(Shape{3, 4}, DType::f32);
  expect_error([&] { gate(logits, 0); }, {"gate: k is 0", "1 .. 4"});
  expect_error([&] { gate(logits, 5, kSoftmax); }, {"gate: k is 5", "1 .. 4"});
  Tensor nan = logits;
  nan.span<float>()[6] = NAN;
  expect_error([&] { gate(nan, 2); }, {"token 1, expert 2 is NaN"});
  expect_error([&] { router_probabilities(nan); }, {"token 1, expert 2 is NaN"});
  expect_error([&] { gate(Tensor(Shape{4}, DType::f32), 1); }, {"logits ([T, experts])"});
  expect_error([&] { gate(Tensor(Shape{3, 4}, DType::i32), 1); }, {"dtype i32 is not supported"});
  expect_error([&] { gate(Tensor(Shape{3, 0}, DType::f32), 1); }, {"k is 1", "1 .. 0"});
}

TEST(RouterProbabilities, SoftmaxOfEveryRowInF32OrF64) {
  const std::int64_t t_count = 7, e_count = 5;
  const Tensor logits = random_normal(Shape{t_count, e_count}, DType::f64, {.seed = 34}, 0, 4);
  for (const DType dt : {DType::f64, DType::f32, DType::bf16}) {
    const Tensor in = logits.astype(dt);
    const Tensor p = router_probabilities(in);
    EXPECT_EQ(p.dtype(), dt == DType::f64 ? DType::f64 : DType::f32);
    ASSERT_EQ(p.shape(), (Shape{t_count, e_count}));
    std::vector<double> want;
    for (std::int64_t t = 0; t < t_count; ++t) {
      double z = 0;
      for (std::int64_t e = 0; e < e_count; ++e) z += std::exp(in.item(t * e_count + e));
      for (std::int64_t e = 0; e < e_count; ++e) {
        want.push_back(std::exp(in.item(t * e_count + e)) / z);
      }
    }
    // A softmax over E logits: f64 against the loop in another order; f32 (and bf16, computed
    // in f32) against the loop in f64 on the same logits.
    const ErrorModel m{.dtype = p.dtype(),
                       .terms = e_count,
                       .reference = dt == DType::f64 ? Reference::other_order : Reference::exact};
    const Comparison c = compare(Tensor::from_vector(p.shape(), want), p, m);
    EXPECT_TRUE(c.passed) << dtype_name(dt) << ": " << c;
  }
  EXPECT_EQ(router_probabilities(Tensor(Shape{0, 3}, DType::f32)).shape(), (Shape{0, 3}));
}

}  // namespace test_ops_moe_gating
}  // namespace meshtest
