// experts (the fused router + grouped-GEMM experts) against the MLP block's own op sequence
// (experts_reference: linear, route_top_k, moe_experts, moe_combine): f64, f32 and bf16 within
// the error model of the other order, bf16 against f32 by nmse and PCC; decode, prefill,
// T = 0, k = 1, k = E, experts without tokens, E = 32 k = 4, no mlp2 bias (the TP partial), the
// program cache, bad inputs.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "src/check/compare.hpp"
#include "src/check/metrics.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/moe/experts.hpp"
#include "src/perf/program_cache.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_ops_experts {

using test_support::expect_error;

/// One problem: the normed activation t and the router/expert weights of E experts.
struct Case {
  Tensor t, gate_weight, gate_bias, mlp1_weight, mlp1_bias, mlp2_weight, mlp2_bias;
  MoeParams p;
  std::string label;

  Case astype(DType d) const {
    return {t.astype(d),
            gate_weight.astype(d),
            gate_bias.astype(d),
            mlp1_weight.astype(d),
            mlp1_bias.astype(d),
            mlp2_weight.astype(d),
            mlp2_bias.astype(d),
            p,
            label + " " + std::string(dtype_name(d))};
  }
  Tensor fused() const {
    return experts(t, gate_weight, gate_bias, mlp1_weight, mlp1_bias, mlp2_weight, mlp2_bias, p);
  }
  Tensor reference() const {
    return experts_reference(t, gate_weight, gate_bias, mlp1_weight, mlp1_bias, mlp2_weight,
                             mlp2_bias, p);
  }
};

/// Seeded weights scaled so that activations stay O(1); the mlp1 bias is wide (std 4) so that
/// some swiglu inputs pass the clamp at 7.
Case make_case(std::int64_t tokens, std::int64_t hidden, std::int64_t inter, std::int64_t e,
               std::int64_t k, DType dtype, std::uint64_t seed) {
  const auto rnd = [&](Shape s, std::uint64_t stream, double std) {
    return random_normal(std::move(s), dtype, {.seed = seed, .stream = stream}, 0.0, std);
  };
  const double wh = 1 / std::sqrt(static_cast<double>(hidden));
  const double wi = 1 / std::sqrt(static_cast<double>(inter));
  Case c{rnd(Shape{tokens, hidden}, 0, 1),
         rnd(Shape{e, hidden}, 1, wh),
         rnd(Shape{e}, 2, 0.5),
         rnd(Shape{e, 2 * inter, hidden}, 3, 2 * wh),
         rnd(Shape{e, 2 * inter}, 4, 4),
         rnd(Shape{e, hidden, inter}, 5, wi),
         rnd(Shape{e, hidden}, 6, 0.5),
         MoeParams{.experts_per_token = k},
         fmt::format("T {} hidden {} I {} E {} k {}", tokens, hidden, inter, e, k)};
  return c;
}

/// The error model of experts against its reference sequence (or another order of itself) for
/// `c`: the same terms added in another order, bf16 rounded at the same steps. n: the router
/// linear over hidden and its bias, its softmax over the E experts, mlp1 over hidden and its
/// bias, mlp2 over I and its bias, the weighted sum over k, and `more` (sums the test adds). r
/// (bf16): the outputs read by a later step: the router logits, the softmax weights, mlp1's
/// product and bias sum, swiglu's five (alpha glu, the sigmoid, glu sigmoid, lin + 1, their
/// product), mlp2's product and bias sum.
ErrorModel experts_model(const Case& c, std::int64_t more = 0) {
  const std::int64_t hidden = c.t.shape()[1], e = c.gate_weight.shape()[0];
  const std::int64_t inter = c.mlp2_weight.shape()[2];
  return {.dtype = c.t.dtype(),
          .terms = (hidden + 1 + e) + (hidden + 1) + (inter + 1) + c.p.experts_per_token + more,
          .roundings = c.t.dtype() == DType::bf16 ? 11 : 0,
          .reference = Reference::other_order};
}

/// Expects got within `m` of expected, with the tensor scale max |expected| (zero-mean normal
/// weights and activations).
void expect_within(const Tensor& expected, const Tensor& got, const ErrorModel& m,
                   const std::string& what) {
  const Comparison c = compare(expected, got, m);
  EXPECT_TRUE(c.passed) << what << ": " << c;
}

struct Size {
  std::int64_t tokens, e, k;
};
// Decode (T = 1), short and longer prefill; k = 1, k = E, gpt-oss's E = 32 top-4.
const std::vector<Size> kSizes{{1, 4, 2},  {1, 32, 4},   {37, 4, 1}, {37, 4, 4},
                               {37, 8, 2}, {128, 32, 4}, {200, 6, 3}};

TEST(Experts, F64AndF32MatchTheReferenceSequence) {
  for (const Size& s : kSizes) {
    const Case c64 = make_case(s.tokens, 24, 20, s.e, s.k, DType::f64, 1);
    const Tensor got = c64.fused();
    ASSERT_EQ(got.shape(), (Shape{s.tokens, 24})) << c64.label;
    expect_within(c64.reference(), got, experts_model(c64), c64.label);
    const Case c32 = c64.astype(DType::f32);
    const Tensor got32 = c32.fused();
    EXPECT_EQ(got32.dtype(), DType::f32);
    expect_within(c32.reference(), got32, experts_model(c32), c32.label);
  }
}

/// Rows of `x` [T, hidden] whose token keeps the same k experts in both routings, as f64.
Eigen::ArrayXd same_route_rows(const Tensor& x, const Routing& a, const Routing& b,
                               std::int64_t& kept) {
  const std::int64_t hidden = x.shape()[1];
  const Eigen::ArrayXd all = to_f64(x);
  std::vector<double> rows;
  kept = 0;
  for (std::int64_t t = 0; t < a.num_tokens; ++t) {
    if (!std::equal(a.experts.begin() + t * a.k, a.experts.begin() + (t + 1) * a.k,
                    b.experts.begin() + t * b.k)) {
      continue;
    }
    ++kept;
    for (std::int64_t h = 0; h < hidden; ++h) rows.push_back(all(t * hidden + h));
  }
  return Eigen::Map<const Eigen::ArrayXd>(rows.data(), static_cast<Eigen::Index>(rows.size()));
}

TEST(Experts, Bf16FollowsTheBf16SequenceAndTracksF32) {
  // bf16 rounds where the sequence rounds: against the bf16 sequence the difference is the
  // GEMMs' summation order at most (within experts_model; bit for bit here). Against f32 on the
  // same (bf16-valued) inputs it is the reference model's bf16 policy, on the tokens whose
  // top-k is the same in both (the bf16 gate logits may reorder near-ties among E = 32: at most
  // 1 token in 16 here): each of the chain's 11 roundings and the output's adds a relative
  // variance u^2 / 3 (u = 2^-8), so nmse ~ 12 u^2 / 3 = 6.1e-5 (measured <= 4e-5): nmse <= 1e-4,
  // and PCC >= 0.9999 (1 - PCC ~ nmse / 2).
  for (const Size& s : kSizes) {
    const Case c16 = make_case(s.tokens, 24, 20, s.e, s.k, DType::f32, 2).astype(DType::bf16);
    const Case c32 = c16.astype(DType::f32);
    const Tensor got = c16.fused();
    EXPECT_EQ(got.dtype(), DType::bf16);
    const Tensor ref16 = c16.reference();
    expect_within(ref16, got, experts_model(c16), c16.label);
    const auto route = [&](const Case& c) {
      return route_top_k(linear(c.t, c.gate_weight, c.gate_bias), s.k);
    };
    const Routing r16 = route(c16), r32 = route(c32);
    std::int64_t kept = 0;
    const Eigen::ArrayXd want = same_route_rows(c32.reference(), r32, r16, kept);
    const Eigen::ArrayXd have = same_route_rows(got, r32, r16, kept);
    EXPECT_GE(kept * 16, s.tokens * 15) << c16.label;
    const double err = nmse(want, have);
    EXPECT_LE(err, 1e-4) << c16.label;
    EXPECT_GE(pcc(want, have), 0.9999) << c16.label;
    fmt::print(
        "bf16 {:<26} same as the bf16 sequence: {}; vs f32: nmse {:.3g} on {} of {} "
        "tokens (same top-k)\n",
        c16.label, ref16.bitwise_equal(got) ? "bit for bit" : "no", err, kept, s.tokens);
  }
}

TEST(Experts, NoTokensGivesAnEmptyResult) {
  for (const DType d : {DType::f32, DType::bf16}) {
    const Case c = make_case(0, 16, 8, 4, 2, d, 3);
    const Tensor got = c.fused();
    EXPECT_EQ(got.shape(), (Shape{0, 16}));
    EXPECT_EQ(got.dtype(), d);
  }
}

TEST(Experts, ExpertsWithoutTokensCostNothingAndChangeNothing) {
  // Experts 3 .. 7 get a gate bias of -1e3: only 0, 1, 2 are ever chosen (k = 2).
  Case c = make_case(29, 16, 12, 8, 2, DType::f64, 4);
  for (std::int64_t e = 3; e < 8; ++e) c.gate_bias.data<double>()[e] = -1e3;
  const Routing r = route_top_k(linear(c.t, c.gate_weight, c.gate_bias), 2);
  for (const std::int64_t e : r.experts) ASSERT_LT(e, 3);
  expect_within(c.reference(), c.fused(), experts_model(c), c.label);
  // NaN weights of the unused experts never reach the output.
  for (std::int64_t i = 3 * 24 * 16; i < c.mlp1_weight.numel(); ++i) {
    c.mlp1_weight.data<double>()[i] = NAN;
  }
  const Tensor got = c.fused();
  for (std::int64_t i = 0; i < got.numel(); ++i) ASSERT_TRUE(std::isfinite(got.item(i))) << i;
}

TEST(Experts, WithoutMlp2BiasIsThePartialOfTensorParallel) {
  // Unset mlp2_bias: out - Σ_j w_j b2[e_j], and two intermediate halves sum to the whole.
  const Case c = make_case(23, 16, 12, 6, 3, DType::f64, 5);
  const Tensor whole = c.fused();
  const Tensor partial = experts(c.t, c.gate_weight, c.gate_bias, c.mlp1_weight, c.mlp1_bias,
                                 c.mlp2_weight, Tensor{}, c.p);
  const Routing r = route_top_k(linear(c.t, c.gate_weight, c.gate_bias), c.p.experts_per_token);
  Tensor expected = partial.astype(DType::f64);
  for (std::int64_t t = 0; t < 23; ++t) {
    for (std::int64_t j = 0; j < 3; ++j) {
      const std::int64_t e = r.experts[t * 3 + j];
      for (std::int64_t h = 0; h < 16; ++h) {
        expected.data<double>()[t * 16 + h] +=
            r.weights.item(t * 3 + j) * c.mlp2_bias.item(e * 16 + h);
      }
    }
  }
  // The test adds the k biases after the weighted sum, the op into each expert's output.
  expect_within(expected, whole, experts_model(c, c.p.experts_per_token), "whole");
  Tensor sum(whole.shape(), DType::f64);
  for (const std::int64_t half : {0, 1}) {
    sum.vector<double>() +=
        experts(c.t, c.gate_weight, c.gate_bias, c.mlp1_weight.slice(1, half * 12, 12),
                c.mlp1_bias.slice(1, half * 12, 12), c.mlp2_weight.slice(2, half * 6, 6), Tensor{},
                c.p)
            .vector<double>();
  }
  // Each half sums its I/2 units; the two halves' partials are added once more.
  expect_within(partial, sum, experts_model(c, 2), "two halves");
}

TEST(Experts, ProgramCacheKeepsTheScratchPerSignature) {
  const Case c = make_case(17, 16, 8, 4, 2, DType::bf16, 6);
  perf::ProgramCache& cache = perf::program_cache();
  cache.clear();
  const Tensor first = c.fused();
  const std::int64_t misses = cache.misses();
  const Tensor second = c.fused();
  EXPECT_EQ(cache.misses(), misses);  // same signature: the scratch is reused
  EXPECT_GE(cache.hits(), 1);
  EXPECT_TRUE(first.bitwise_equal(second));
  const perf::ProgramCacheSwitch off(false);
  EXPECT_TRUE(first.bitwise_equal(c.fused()));
  // Another T is another signature (and the scratch of the first is not reused for it).
  const Case longer = make_case(40, 16, 8, 4, 2, DType::bf16, 6);
  expect_within(longer.reference(), longer.fused(), experts_model(longer), longer.label);
}

TEST(Experts, BadInputThrowsNamingTheTensor) {
  const Case c = make_case(5, 16, 8, 4, 2, DType::f32, 7);
  const auto run = [](const Case& b) { return [b] { b.fused(); }; };
  Case b = c;
  b.t = Tensor(Shape{16}, DType::f32);
  expect_error(run(b), {"experts", "t ([T, hidden])"});
  b = c.astype(DType::i32);
  expect_error(run(b), {"experts", "dtype i32"});
  b = c;
  b.mlp1_weight = Tensor(Shape{4, 15, 16}, DType::f32);
  expect_error(run(b), {"experts", "mlp1_weight"});
  b = c;
  b.mlp2_weight = Tensor(Shape{4, 16, 9}, DType::f32);  // I = 9 does not match mlp1's 2I = 16
  expect_error(run(b), {"experts", "mlp1_weight"});
  b = c;
  b.gate_weight = Tensor(Shape{4, 15}, DType::f32);
  expect_error(run(b), {"experts", "gate.weight"});
  b = c;
  b.mlp2_bias = Tensor(Shape{3, 16}, DType::f32);
  expect_error(run(b), {"experts", "mlp2_bias"});
  b = c;
  b.mlp1_bias = c.mlp1_bias.astype(DType::bf16);
  expect_error(run(b), {"experts", "mlp1_bias", "bf16"});
  b = c;
  b.p.experts_per_token = 5;
  expect_error(run(b), {"experts", "experts_per_token is 5", "1 .. 4"});
  b.p.experts_per_token = 0;
  expect_error(run(b), {"experts", "experts_per_token is 0"});
  b = c;
  b.t.data<float>()[3] = NAN;
  expect_error(run(b), {"route_top_k", "NaN"});
}

}  // namespace test_ops_experts
}  // namespace meshtest
