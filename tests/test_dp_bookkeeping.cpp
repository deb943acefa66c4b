// Book-keeping clipping: (diag(c) G)ᵀ A and Σ_i c_i Σ_t g_it against naive per-sample sums,
// clip coefficients in closed form, and the fused_bk mode against Σ c_i ∇W_i by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/dp/bookkeeping.hpp"
#include "src/dp/clip.hpp"
#include "src/dp/modes.hpp"
#include "tests/support/dp_reference.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::dp {
namespace test_dp_bookkeeping {

using test_support::naive_sample_bias_grad;
using test_support::naive_sample_weight_grad;

// Σ_i c_i W_i and Σ_i c_i b_i by naive loops.
std::pair<Tensor, Tensor> naive_clipped(const Tensor& a, const Tensor& g, const Tensor& c) {
  const std::int64_t din = a.shape()[a.rank() - 1], dout = g.shape()[g.rank() - 1];
  Tensor w(Shape{dout, din}, DType::f64), b(Shape{dout}, DType::f64);
  for (std::int64_t i = 0; i < a.shape()[0]; ++i) {
    w.vector<double>() += c.item(i) * naive_sample_weight_grad(a, g, i).vector<double>();
    b.vector<double>() += c.item(i) * naive_sample_bias_grad(g, i).vector<double>();
  }
  return {w, b};
}

std::int64_t tokens(const Tensor& a) { return a.shape()[0] * (a.rank() == 3 ? a.shape()[1] : 1); }

// Expects `got` within the error model of `want` with each element's magnitude `scale`.
void expect_model(const Tensor& want, const Tensor& got, const ErrorModel& m, const Tensor& scale,
                  const std::string& label) {
  test_support::expect_within(want, got, m, label, scale);
}

TEST(TestTritonFusedKernel, TritonKernelBasic) {
  // c = 1: the book-keeping sum is the ordinary weight gradient Σ_i G_iᵀA_i.
  for (const Shape& sa : {Shape{4, 6, 5}, Shape{7, 5}}) {
    const Tensor a = random_normal(sa, DType::f64, {.seed = 1});
    const Tensor g = random_normal(sa.with(sa.rank() - 1, 3), DType::f64, {.seed = 2});
    Tensor c(Shape{sa[0]}, DType::f64);
    c.fill(1.0);
    // B·T products per element, against each element's Σ |c g a| (the loops on magnitudes).
    expect_model(naive_clipped(a, g, c).first, clipped_weight_grad(a, g, c),
                 {.dtype = DType::f64, .terms = tokens(a)},
                 naive_clipped(magnitude(a), magnitude(g), c).first, sa.str());
  }
}

TEST(TestTritonFusedKernel, TritonKernelWithClipping) {
  for (DType dt : {DType::f64, DType::f32}) {
    const Tensor a = random_normal({5, 4, 6}, dt, {.seed = 3});
    const Tensor g = random_normal({5, 4, 3}, dt, {.seed = 4});
    const Tensor c = random_uniform({5}, dt, {.seed = 5}, 0.05, 1.0);
    // The loops run in f64: an exact reference for f32, another order for f64.
    const ErrorModel m{.dtype = dt,
                       .terms = tokens(a),
                       .reference = dt == DType::f64 ? Reference::other_order : Reference::exact};
    expect_model(naive_clipped(a, g, c).first, clipped_weight_grad(a, g, c), m,
                 naive_clipped(magnitude(a), magnitude(g), c).first, std::string(dtype_name(dt)));
  }
}

TEST(TestTritonFusedKernel, TritonKernelBiasHandling) {
  const Tensor a = random_normal({5, 4, 6}, DType::f64, {.seed = 6});
  const Tensor g = random_normal({5, 4, 3}, DType::f64, {.seed = 7});
  const Tensor c = random_uniform({5}, DType::f64, {.seed = 8}, 0.05, 1.0);
  // Σ_i c_i Σ_t g: B·T terms per element.
  expect_model(naive_clipped(a, g, c).second, clipped_bias_grad(g, c),
               {.dtype = DType::f64, .terms = tokens(g)},
               naive_clipped(magnitude(a), magnitude(g), c).second, "3-D");
  const Tensor g2 = g.reshape({20, 3}).slice(0, 0, 5);  // 2-D: T = 1
  const Tensor a2 = a.reshape({20, 6}).slice(0, 0, 5);
  expect_model(naive_clipped(a2, g2, c).second, clipped_bias_grad(g2, c),
               {.dtype = DType::f64, .terms = tokens(g2)},
               naive_clipped(magnitude(a2), magnitude(g2), c).second, "2-D");
}

TEST(TestTritonFusedKernel, ClippedSumOfInstantiatedGrads) {
  const Tensor ps = random_normal({4, 3, 2}, DType::f64, {.seed = 9});
  const Tensor c = Tensor::from_vector<double>({4}, {1.0, 0.5, 0.25, 0.0});
  const Tensor got = clipped_sum(ps, c);
  // The products by powers of two are exact; the 4 terms are added in the GEMV's order.
  Tensor want(Shape{3, 2}, DType::f64), mag(Shape{3, 2}, DType::f64);
  for (std::int64_t j = 0; j < 6; ++j) {
    want.data<double>()[j] = ps.item(j) + 0.5 * ps.item(6 + j) + 0.25 * ps.item(12 + j);
    mag.data<double>()[j] =
        std::abs(ps.item(j)) + 0.5 * std::abs(ps.item(6 + j)) + 0.25 * std::abs(ps.item(12 + j));
  }
  expect_model(want, got, {.dtype = DType::f64, .terms = ps.shape()[0]}, mag, "clipped_sum");
}

TEST(TestTritonFusedKernel, PerSampleGradsInstantiated) {
  for (const Shape& sa : {Shape{3, 5, 4}, Shape{6, 4}}) {
    const Tensor a = random_normal(sa, DType::f64, {.seed = 14});
    const Tensor g = random_normal(sa.with(sa.rank() - 1, 3), DType::f64, {.seed = 15});
    const Tensor pw = per_sample_weight_grads(a, g);
    const Tensor pb = per_sample_bias_grads(g);
    ASSERT_EQ(pw.shape(), (Shape{sa[0], 3, 4}));
    // Each sample's T products per element, against each element's Σ |g a| (or Σ |g|).
    const ErrorModel m{.dtype = DType::f64, .terms = tokens(a) / sa[0]};
    for (std::int64_t i = 0; i < sa[0]; ++i) {
      const std::string l = sa.str() + " sample " + std::to_string(i);
      expect_model(naive_sample_weight_grad(a, g, i), pw.slice(0, i, 1).reshape({3, 4}), m,
                   naive_sample_weight_grad(magnitude(a), magnitude(g), i), l + " weight");
      expect_model(naive_sample_bias_grad(g, i), pb.slice(0, i, 1).reshape({3}), m,
                   naive_sample_bias_grad(magnitude(g), i), l + " bias");
    }
  }
}

TEST(TestTritonFusedKernel, ClipCoefficientsClosedForm) {
  const Tensor n = Tensor::from_vector<double>({5}, {0.0, 0.5, 1.0, 2.0, 10.0});
  const Tensor c = clip_coefficients(n, 1.0);
  EXPECT_EQ(c.item(0), 1.0);
  EXPECT_EQ(c.item(1), 1.0);
  EXPECT_EQ(c.item(2), 1.0 / (1.0 + 1e-6));
  EXPECT_EQ(c.item(3), 1.0 / (2.0 + 1e-6));
  EXPECT_EQ(c.item(4), 1.0 / (10.0 + 1e-6));
  test_support::expect_error([&] { clip_coefficients(n, 0.0); }, {"C > 0", "is 0"});
  test_support::expect_error([&] { clip_coefficients(n, -1.0); }, {"C > 0"});
}

TEST(TestTritonFusedKernel, BadInput) {
  using test_support::expect_error;
  const Tensor a = random_normal({5, 4, 6}, DType::f64, {.seed = 1});
  const Tensor g = random_normal({5, 4, 3}, DType::f64, {.seed = 2});
  expect_error([&] { clipped_weight_grad(a, g, Tensor({4}, DType::f64)); }, {"coef", "[5]"});
  expect_error([&] { clipped_weight_grad(a, g.slice(1, 0, 3), Tensor({5}, DType::f64)); },
               {"differ in B or T"});
  expect_error([&] { clipped_bias_grad(g, Tensor({5}, DType::f32)); }, {"coef"});
}

TEST(TestPerformanceComparison, FuseBkGradientAccumulationCorrectness) {
  // fused_bk on a model against Σ_i c_i ∇W_i by hand, with per-sample grads from each sample
  // alone; C picked so that some samples are clipped and some are not.
  const Sequential model = parse_model("linear:6,relu,linear:4", 5, DType::f64, {.seed = 11});
  const Tensor x = random_normal({6, 3, 5}, DType::f64, {.seed = 12});
  const Tensor y = random_normal({6, 3, 4}, DType::f64, {.seed = 13});
  DpOptions opt{.clip = 1.0, .loss = LossKind::mse, .reduction = Reduction::sum};
  const auto probe = test_support::dp_reference(model, x, y, opt);
  std::vector<double> sorted = probe.norms;
  std::sort(sorted.begin(), sorted.end());
  opt.clip = sorted[3];
  const auto ref = test_support::dp_reference(model, x, y, opt);
  int clipped = 0;
  for (double c : ref.coef) clipped += c < 1.0;
  EXPECT_GE(clipped, 2);
  EXPECT_LE(clipped, 4);
  PrivateModel pm(model, "fused_bk", opt);
  const DpGrads got = pm.compute(x, y);
  ASSERT_EQ(got.grads.size(), ref.clipped.size());
  // The model's chains (test_support::dp_terms), f64 in another order.
  const test_support::DpTerms n = test_support::dp_terms(model, x);
  for (std::size_t p = 0; p < got.grads.size(); ++p) {
    const Comparison r =
        compare(ref.clipped[p], got.grads[p], ErrorModel{.dtype = DType::f64, .terms = n.clipped});
    EXPECT_TRUE(r.passed) << "param " << p << ": " << r;
  }
  expect_model(test_support::as_tensor(ref.coef), got.coef, {.dtype = DType::f64, .terms = n.norm},
               test_support::coef_scale(ref), "coef");
}

}  // namespace test_dp_bookkeeping
}  // namespace meshtest::dp
