// DP kernels: ghost and direct per-sample norms against per-sample gradients built by naive
// loops, the fused Linear module, and the Linear -> FusedLinear swap.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/core/random.hpp"
#include "src/dp/norms.hpp"
#include "src/dp/sequential.hpp"
#include "src/ops/gelu.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/linear_grad.hpp"
#include "tests/support/dp_reference.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::dp {
namespace {

using test_support::naive_sample_bias_grad;
using test_support::naive_sample_weight_grad;
using test_support::rel_err;
using test_support::sum_sq;

struct Case {
  std::int64_t batch, seq, din, dout;  // seq 0: a 2-D [B, d] input
  DType dtype = DType::f64;
};

std::string name(const Case& c) {
  return fmt::format("B={} T={} din={} dout={} {}", c.batch, c.seq, c.din, c.dout, c.dtype);
}

Shape shape_of(const Case& c, std::int64_t d) {
  return c.seq == 0 ? Shape{c.batch, d} : Shape{c.batch, c.seq, d};
}

Tensor make(const Case& c, std::int64_t d, std::uint64_t seed) {
  return random_normal(shape_of(c, d), c.dtype, {.seed = seed});
}

// ‖G_iᵀA_i‖² by naive loops in f64.
Tensor naive_norm_sq(const Tensor& a, const Tensor& g) {
  std::vector<double> out;
  for (std::int64_t i = 0; i < a.shape()[0]; ++i)
    out.push_back(sum_sq(naive_sample_weight_grad(a, g, i)));
  return test_support::as_tensor(out);
}

double tol(const Case& c) { return c.dtype == DType::f64 ? 1e-12 : 2e-5; }

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
    EXPECT_LE(rel_err(ghost_norm_sq(a, g), naive_norm_sq(a, g)), tol(c)) << name(c);
  }
}

TEST(TestFusedFlashLinearKernels, InputLengthFrobenius3D) {
  for (const Case& c : kCases) {
    if (c.seq == 0) continue;
    const Tensor a = make(c, c.din, 3), g = make(c, c.dout, 4);
    const Tensor got = ghost_norm_sq(a, g);
    EXPECT_EQ(got.shape(), (Shape{c.batch})) << name(c);
    EXPECT_LE(rel_err(got, naive_norm_sq(a, g)), tol(c)) << name(c);
  }
}

TEST(TestFusedFlashLinearKernels, WidthFrobeniusMatchesInputLength) {
  for (const Case& c : kCases) {
    const Tensor a = make(c, c.din, 5), g = make(c, c.dout, 6);
    const Tensor ghost = ghost_norm_sq(a, g);
    EXPECT_LE(rel_err(direct_norm_sq(a, g), ghost), tol(c)) << name(c);
    EXPECT_LE(rel_err(direct_norm_sq(a, g), naive_norm_sq(a, g)), tol(c)) << name(c);
  }
}

TEST(TestFusedFlashLinearKernels, WidthFusedWithWeightGradPass) {
  for (const Case& c : kCases) {
    const Tensor a = make(c, c.din, 7), g = make(c, c.dout, 8);
    Tensor wg(Shape{c.dout, c.din}, c.dtype);
    const Tensor sq = direct_norm_sq(a, g, &wg);
    Tensor want(Shape{c.dout, c.din}, DType::f64);
    for (std::int64_t i = 0; i < c.batch; ++i) {
      want.vector<double>() += naive_sample_weight_grad(a, g, i).vector<double>();
    }
    EXPECT_LE(rel_err(wg, want), tol(c)) << name(c);
    EXPECT_LE(rel_err(sq, naive_norm_sq(a, g)), tol(c)) << name(c);
  }
}

TEST(TestFusedFlashLinearKernels, BiasNormAndHybridRule) {
  const Case c{4, 6, 3, 5};
  const Tensor g = make(c, c.dout, 9);
  std::vector<double> want;
  for (std::int64_t i = 0; i < c.batch; ++i) want.push_back(sum_sq(naive_sample_bias_grad(g, i)));
  EXPECT_LE(rel_err(bias_norm_sq(g), test_support::as_tensor(want)), 1e-12);
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
    // and a naive loop, in f64
    const Tensor y = fused.forward(x);
    double worst = 0;
    for (std::int64_t r = 0; r < 15; ++r) {
      for (std::int64_t o = 0; o < 4; ++o) {
        double acc = plain.params()[1].value.item(o);
        for (std::int64_t k = 0; k < 6; ++k)
          acc += x.item(r * 6 + k) * plain.params()[0].value.item(o * 6 + k);
        worst = std::max(worst, std::abs(acc - y.item(r * 4 + o)));
      }
    }
    EXPECT_LE(worst, dt == DType::f64 ? 1e-12 : 1e-5) << dtype_name(dt);
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
    Tensor wsum(Shape{c.dout, c.din}, DType::f64);
    for (std::int64_t i = 0; i < c.batch; ++i) {
      const Tensor wi = naive_sample_weight_grad(x, g, i);
      wsum.vector<double>() += wi.vector<double>();
      want.push_back(4.0 * (sum_sq(wi) + sum_sq(naive_sample_bias_grad(g, i))));
    }
    EXPECT_LE(rel_err(ctx.norm_sq, test_support::as_tensor(want)), 1e-12) << name(c);
    EXPECT_LE(rel_err(fused.params()[0].grad, wsum), 1e-12) << name(c);
    const LinearGrads ref = linear_backward(x, plain.params()[0].value, g);
    EXPECT_LE(rel_err(gx, ref.input), 1e-12) << name(c);
    EXPECT_LE(rel_err(fused.params()[1].grad, ref.bias), 1e-12) << name(c);
  }
}

TEST(TestFusedFlashLinearModule, LinearBackwardAgainstNaiveLoops) {
  const Tensor x = random_normal({2, 3, 4}, DType::f64, {.seed = 30});
  const Tensor w = random_normal({5, 4}, DType::f64, {.seed = 31});
  const Tensor g = random_normal({2, 3, 5}, DType::f64, {.seed = 32});
  const LinearGrads lg = linear_backward(x, w, g);
  Tensor wsum(Shape{5, 4}, DType::f64), bsum(Shape{5}, DType::f64), gx(Shape{2, 3, 4}, DType::f64);
  for (std::int64_t i = 0; i < 2; ++i) {
    wsum.vector<double>() += naive_sample_weight_grad(x, g, i).vector<double>();
    bsum.vector<double>() += naive_sample_bias_grad(g, i).vector<double>();
  }
  for (std::int64_t r = 0; r < 6; ++r) {
    for (std::int64_t k = 0; k < 4; ++k) {
      for (std::int64_t o = 0; o < 5; ++o)
        gx.data<double>()[r * 4 + k] += g.item(r * 5 + o) * w.item(o * 4 + k);
    }
  }
  EXPECT_LE(rel_err(lg.weight, wsum), 1e-13);
  EXPECT_LE(rel_err(lg.bias, bsum), 1e-13);
  EXPECT_LE(rel_err(lg.input, gx), 1e-13);
  test_support::expect_error([&] { linear_backward(x, w, x); }, {"grad_out has shape"});
}

TEST(TestFusedFlashLinearModule, GeluIsTheErfForm) {
  const Tensor x = Tensor::from_vector<double>({4}, {-2.0, -0.5, 0.0, 1.5});
  const Tensor y = gelu(x);
  for (std::int64_t i = 0; i < 4; ++i) {
    const double v = x.item(i);
    EXPECT_NEAR(y.item(i), 0.5 * v * std::erfc(-v / std::sqrt(2.0)), 1e-15) << v;
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

}  // namespace
}  // namespace meshtest::dp
