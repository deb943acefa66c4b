// DP kernels: ghost and direct per-sample norms against per-sample gradients built by naive
// loops, the fused Linear module, and the Linear -> FusedLinear swap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/dp/norms.hpp"
#include "src/dp/sequential.hpp"
#include "src/ops/gelu.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/linear_grad.hpp"
#include "tests/support/dp_norm_cases.hpp"
#include "tests/support/dp_reference.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::dp {
namespace test_dp_kernels {

using test_support::naive_sample_bias_grad;
using test_support::naive_sample_weight_grad;
using test_support::sum_sq;

using Case = test_support::NormCase;
using test_support::make;
using test_support::naive_norm_sq;
using test_support::name;
using test_support::norm_model;
using test_support::seq;

// Σ_i G_iᵀA_i (and its magnitude, on |a| and |g|) by the naive loops, in f64.
Tensor naive_weight_grad(const Tensor& a, const Tensor& g) {
  Tensor w(Shape{g.shape()[g.rank() - 1], a.shape()[a.rank() - 1]}, DType::f64);
  for (std::int64_t i = 0; i < a.shape()[0]; ++i) {
    w.vector<double>() += naive_sample_weight_grad(a, g, i).vector<double>();
  }
  return w;
}

// Expects `got` within `m` of `want`, the norms' scale max |want| (sums of squares).
void expect_model(const Tensor& want, const Tensor& got, const ErrorModel& m,
                  const std::string& label) {
  const Comparison r = compare(want, got, m);
  EXPECT_TRUE(r.passed) << label << ": " << r;
}

const std::vector<Case> kCases = {
    {5, 0, 7, 3},
    {4, 9, 7, 5},
    {3, 300, 3, 4},
    {2, 3, 300, 270},
    {1, 1, 4, 4},
    {3, 17, 6, 2},
    {0, 4, 3, 2},
    {4, 9, 7, 5, DType::f32},
    {6, 0, 5, 8, DType::f32},
    {2, 1100, 3, 2},  // T > 1024: the ghost Gram built in row blocks
};

TEST(TestFusedFlashLinearKernels, InputLengthFrobenius2D) {
  for (const Case& c : kCases) {
    if (c.seq != 0) continue;
    const Tensor a = make(c, c.din, 1), g = make(c, c.dout, 2);
    expect_model(naive_norm_sq(a, g), ghost_norm_sq(a, g), norm_model(c), name(c));
  }
}

TEST(TestFusedFlashLinearKernels, InputLengthFrobenius3D) {
  for (const Case& c : kCases) {
    if (c.seq == 0) continue;
    const Tensor a = make(c, c.din, 3), g = make(c, c.dout, 4);
    const Tensor got = ghost_norm_sq(a, g);
    EXPECT_EQ(got.shape(), (Shape{c.batch})) << name(c);
    expect_model(naive_norm_sq(a, g), got, norm_model(c), name(c));
  }
}

TEST(TestFusedFlashLinearKernels, WidthFrobeniusMatchesInputLength) {
  for (const Case& c : kCases) {
    const Tensor a = make(c, c.din, 5), g = make(c, c.dout, 6);
    const Tensor ghost = ghost_norm_sq(a, g);
    // direct against ghost: both in the inputs' dtype, in other orders.
    ErrorModel both = norm_model(c);
    both.reference = Reference::other_order;
    expect_model(ghost, direct_norm_sq(a, g), both, name(c) + " direct vs ghost");
    expect_model(naive_norm_sq(a, g), direct_norm_sq(a, g), norm_model(c), name(c));
  }
}

TEST(TestFusedFlashLinearKernels, WidthFusedWithWeightGradPass) {
  for (const Case& c : kCases) {
    const Tensor a = make(c, c.din, 7), g = make(c, c.dout, 8);
    Tensor wg(Shape{c.dout, c.din}, c.dtype);
    const Tensor sq = direct_norm_sq(a, g, &wg);
    // Σ_i G_iᵀA_i: B·T products per element, each element's own magnitude Σ |g||a|.
    const ErrorModel wm{.dtype = c.dtype,
                        .terms = std::max<std::int64_t>(c.batch * seq(c), 1),
                        .reference = norm_model(c).reference};
    const Comparison w =
        compare(naive_weight_grad(a, g), wg, wm, naive_weight_grad(magnitude(a), magnitude(g)));
    EXPECT_TRUE(w.passed) << name(c) << " weight grad: " << w;
    expect_model(naive_norm_sq(a, g), sq, norm_model(c), name(c));
  }
}

TEST(TestFusedFlashLinearKernels, BiasNormAndHybridRule) {
  const Case c{4, 6, 3, 5};
  const Tensor g = make(c, c.dout, 9);
  std::vector<double> want;
  for (std::int64_t i = 0; i < c.batch; ++i) want.push_back(sum_sq(naive_sample_bias_grad(g, i)));
  // Σ_t g over T, then the d_out squares.
  expect_model(test_support::as_tensor(want), bias_norm_sq(g),
               {.dtype = DType::f64, .terms = c.seq + c.dout}, "bias norm");
  // ghost when 2T² <= d_in·d_out
  EXPECT_EQ(hybrid_method(4, 4, 8), NormMethod::ghost);   // 32 <= 32
  EXPECT_EQ(hybrid_method(5, 4, 8), NormMethod::direct);  // 50 > 32
  EXPECT_EQ(hybrid_method(64, 1024, 1024), NormMethod::ghost);
  EXPECT_EQ(hybrid_method(1024, 1024, 1024), NormMethod::direct);
}

TEST(TestFusedFlashLinearKernels, NormsFromSquaresClampAtZero) {
  const Tensor sq = Tensor::from_vector<double>({3}, {-1e-18, 4.0, 0.0});
  const Tensor n = norms_from_squares(sq);
  EXPECT_EQ(n.item(0), 0.0);
  EXPECT_EQ(n.item(1), 2.0);
  EXPECT_EQ(n.item(2), 0.0);
}

TEST(TestFusedFlashLinearKernels, BadInput) {
  using test_support::expect_error;
  const Tensor a = random_normal({2, 3, 4}, DType::f64, {.seed = 1});
  expect_error(
      [&] {
        ghost_norm_sq(a, random_normal({2, 4, 5}, DType::f64, {.seed = 2}));
      },
      {"differ in B or T"});
  expect_error(
      [&] {
        direct_norm_sq(a, random_normal({2, 3, 5}, DType::f32, {.seed = 2}));
      },
      {"f32"});
  expect_error(
      [&] {
        ghost_norm_sq(Tensor({2, 0, 4}, DType::f64), Tensor({2, 0, 5}, DType::f64));
      },
      {"T = 0"});
  expect_error([&] { bias_norm_sq(Tensor({2, 3, 4, 5}, DType::f64)); }, {"[B, d] or [B, T, d]"});
  Tensor wrong(Shape{4, 5}, DType::f64);
  expect_error(
      [&] {
        direct_norm_sq(a, random_normal({2, 3, 5}, DType::f64, {.seed = 2}), &wrong);
      },
      {"weight_grad"});
}

// ---------------------------------------------------------------- the fused Linear module

Linear make_linear(std::int64_t din, std::int64_t dout, DType dt, std::uint64_t seed) {
  return Linear(random_normal({dout, din}, dt, {.seed = seed}),
                random_normal({dout}, dt, {.seed = seed + 1}), 0);
}

TEST(TestFusedFlashLinearModule, ForwardMatchesLinear) {
  for (DType dt : {DType::f64, DType::f32}) {
    Linear plain = make_linear(6, 4, dt, 10);
    FusedLinear fused(plain);
    const Tensor x = random_normal({3, 5, 6}, dt, {.seed = 12});
    const Tensor want = linear(x, plain.params()[0].value, plain.params()[1].value);
    EXPECT_TRUE(fused.forward(x).bitwise_equal(want)) << dtype_name(dt);
    // and a naive loop, in f64: 6 products and the bias per element, against each element's
    // magnitude (the same linear on |x|, |w|, |b|); exact for f32, another order for f64.
    const Tensor& w = plain.params()[0].value;
    const Tensor& b = plain.params()[1].value;
    Tensor loop(Shape{3, 5, 4}, DType::f64);
    for (std::int64_t r = 0; r < 15; ++r) {
      for (std::int64_t o = 0; o < 4; ++o) {
        double acc = b.item(o);
        for (std::int64_t k = 0; k < 6; ++k) acc += x.item(r * 6 + k) * w.item(o * 6 + k);
        loop.data<double>()[r * 4 + o] = acc;
      }
    }
    const ErrorModel m{.dtype = dt,
                       .terms = w.shape()[1] + 1,
                       .reference = dt == DType::f64 ? Reference::other_order : Reference::exact};
    const Comparison r =
        compare(loop, fused.forward(x), m, linear(magnitude(x), magnitude(w), magnitude(b)));
    EXPECT_TRUE(r.passed) << dtype_name(dt) << ": " << r;
  }
}

TEST(TestFusedFlashLinearModule, BackwardComputesNorms) {
  // T = 2: ghost (8 <= 24); T = 9: direct (162 > 24); 2-D: T = 1.
  for (const Case& c : {Case{3, 2, 6, 4}, Case{3, 9, 6, 4}, Case{4, 0, 6, 4}}) {
    Linear plain = make_linear(c.din, c.dout, c.dtype, 20);
    FusedLinear fused(plain);
    const Tensor x = make(c, c.din, 21), g = make(c, c.dout, 22);
    fused.forward(x);
    BackwardContext ctx{.grads = true,
                        .norms = true,
                        .norm_scale = 2.0,
                        .norm_sq = Tensor(Shape{c.batch}, c.dtype)};
    const Tensor gx = fused.backward(g, ctx);
    std::vector<double> want;
    for (std::int64_t i = 0; i < c.batch; ++i) {
      want.push_back(
          4.0 * (sum_sq(naive_sample_weight_grad(x, g, i)) + sum_sq(naive_sample_bias_grad(g, i))));
    }
    // The weight's norm chain and the bias's (T, then d_out squares), added.
    ErrorModel norms = norm_model(c);
    norms.terms += seq(c) + c.dout;
    expect_model(test_support::as_tensor(want), ctx.norm_sq, norms, name(c) + " norms");
    // The gradients, each element against its own magnitude (the same sums on |x|, |w|, |g|):
    // the weight's and the bias's over the B·T tokens, the input's over d_out.
    const Tensor& w = plain.params()[0].value;
    const LinearGrads ref = linear_backward(x, w, g);
    const LinearGrads mag = linear_backward(magnitude(x), magnitude(w), magnitude(g));
    const ErrorModel tokens{.dtype = DType::f64, .terms = c.batch * seq(c)};
    const ErrorModel outs{.dtype = DType::f64, .terms = c.dout};
    for (const auto& [what, want_t, got, m, scale] :
         {std::tuple{"weight grad", naive_weight_grad(x, g), fused.params()[0].grad, tokens,
                     mag.weight},
          std::tuple{"input grad", ref.input, gx, outs, mag.input},
          std::tuple{"bias grad", ref.bias, fused.params()[1].grad, tokens, mag.bias}}) {
      const Comparison r = compare(want_t, got, m, scale);
      EXPECT_TRUE(r.passed) << name(c) << " " << what << ": " << r;
    }
  }
}

TEST(TestFusedFlashLinearModule, LinearBackwardAgainstNaiveLoops) {
  const Tensor x = random_normal({2, 3, 4}, DType::f64, {.seed = 30});
  const Tensor w = random_normal({5, 4}, DType::f64, {.seed = 31});
  const Tensor g = random_normal({2, 3, 5}, DType::f64, {.seed = 32});
  const LinearGrads lg = linear_backward(x, w, g);
  // The naive loops on the values and on their magnitudes (each element's Σ |terms|).
  const auto naive = [](const Tensor& x, const Tensor& w, const Tensor& g) {
    LinearGrads out{.input = Tensor(Shape{2, 3, 4}, DType::f64),
                    .weight = Tensor(Shape{5, 4}, DType::f64),
                    .bias = Tensor(Shape{5}, DType::f64)};
    for (std::int64_t i = 0; i < 2; ++i) {
      out.weight.vector<double>() += naive_sample_weight_grad(x, g, i).vector<double>();
      out.bias.vector<double>() += naive_sample_bias_grad(g, i).vector<double>();
    }
    for (std::int64_t r = 0; r < 6; ++r) {
      for (std::int64_t k = 0; k < 4; ++k) {
        for (std::int64_t o = 0; o < 5; ++o)
          out.input.data<double>()[r * 4 + k] += g.item(r * 5 + o) * w.item(o * 4 + k);
      }
    }
    return out;
  };
  const LinearGrads want = naive(x, w, g);
  const LinearGrads mag = naive(magnitude(x), magnitude(w), magnitude(g));
  // The weight and bias sum over the B·T = 6 rows, the input over d_out = 5.
  const ErrorModel rows{.dtype = DType::f64, .terms = x.shape()[0] * x.shape()[1]};
  const ErrorModel outs{.dtype = DType::f64, .terms = w.shape()[0]};
  const Comparison cw = compare(want.weight, lg.weight, rows, mag.weight);
  const Comparison cb = compare(want.bias, lg.bias, rows, mag.bias);
  const Comparison ci = compare(want.input, lg.input, outs, mag.input);
  EXPECT_TRUE(cw.passed) << "weight: " << cw;
  EXPECT_TRUE(cb.passed) << "bias: " << cb;
  EXPECT_TRUE(ci.passed) << "input: " << ci;
  test_support::expect_error([&] { linear_backward(x, w, x); }, {"grad_out has shape"});
}

TEST(TestFusedFlashLinearModule, GeluIsTheErfForm) {
  const Tensor x = Tensor::from_vector<double>({4}, {-2.0, -0.5, 0.0, 1.5});
  const Tensor y = gelu(x);
  for (std::int64_t i = 0; i < 4; ++i) {
    const double v = x.item(i);
    // 0.5 v (1 + erf) against 0.5 v erfc: a few roundings of terms up to |v| (1 + erf lies in
    // [0, 2]) and the libm functions' ulp, on any processor: 8 ulps of |v|.
    EXPECT_NEAR(y.item(i), 0.5 * v * std::erfc(-v / std::sqrt(2.0)),
                8 * std::ldexp(std::abs(v), -52))
        << v;
  }
}

// ---------------------------------------------------------------- replace Linear with fused

TEST(TestReplaceLinearWithFused, ReplacePreservesWeights) {
  const Sequential plain =
      parse_model("linear:5,relu,linear:4,gelu,rmsnorm,linear:3", 6, DType::f64, {.seed = 3});
  Sequential fused = plain;
  EXPECT_EQ(replace_linear_with_fused(fused), 3);
  const auto pp = plain.parameters();
  const auto fp = fused.parameters();
  ASSERT_EQ(pp.size(), fp.size());
  for (std::size_t i = 0; i < pp.size(); ++i) {
    EXPECT_EQ(pp[i]->name, fp[i]->name);
    EXPECT_TRUE(pp[i]->value.bitwise_equal(fp[i]->value)) << pp[i]->name;
  }
  const Tensor x = random_normal({2, 3, 6}, DType::f64, {.seed = 4});
  Sequential p2 = plain;
  EXPECT_TRUE(fused.forward(x).bitwise_equal(p2.forward(x)));
  EXPECT_EQ(replace_linear_with_fused(fused), 0);  // nothing left to replace
}

TEST(TestReplaceLinearWithFused, GetFusedModules) {
  Sequential m = parse_model("linear:5,relu,linear:4,rmsnorm,gelu,linear:3", 6, DType::f32);
  EXPECT_TRUE(fused_modules(m).empty());
  replace_linear_with_fused(m);
  EXPECT_EQ(fused_modules(m), (std::vector<std::string>{"0", "2", "5"}));
  std::vector<std::string> names;
  for (const Param* p : m.parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "3.weight",
                                             "5.weight", "5.bias"}));
}

TEST(TestReplaceLinearWithFused, SpecErrors) {
  using test_support::expect_error;
  expect_error([] { parse_model("linear:4,tanh", 3, DType::f64); }, {"unknown layer 'tanh'"});
  expect_error([] { parse_model("linear:0", 3, DType::f64); }, {"width > 0"});
  expect_error([] { parse_model("linear:x", 3, DType::f64); }, {"width > 0"});
  expect_error([] { parse_model("relu", 3, DType::bf16); }, {"bf16"});
}

}  // namespace test_dp_kernels
}  // namespace meshtest::dp
