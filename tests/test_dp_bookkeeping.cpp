// Book-keeping clipping: (diag(c) G)ᵀ A and Σ_i c_i Σ_t g_it against naive per-sample sums,
// clip coefficients in closed form, and the fused_bk mode against Σ c_i ∇W_i by hand.
#include <gtest/gtest.h>

#include <vector>

#include "src/core/random.hpp"
#include "src/dp/bookkeeping.hpp"
#include "src/dp/clip.hpp"
#include "src/dp/modes.hpp"
#include "tests/support/dp_reference.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::dp {
namespace {

using test_support::naive_sample_bias_grad;
using test_support::naive_sample_weight_grad;
using test_support::rel_err;

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

TEST(TestTritonFusedKernel, TritonKernelBasic) {
  // c = 1: the book-keeping sum is the ordinary weight gradient Σ_i G_iᵀA_i.
  for (const Shape& sa : {Shape{4, 6, 5}, Shape{7, 5}}) {
    const Tensor a = random_normal(sa, DType::f64, {.seed = 1});
    const Tensor g = random_normal(sa.with(sa.rank() - 1, 3), DType::f64, {.seed = 2});
    Tensor c(Shape{sa[0]}, DType::f64);
    c.fill(1.0);
    EXPECT_LE(rel_err(clipped_weight_grad(a, g, c), naive_clipped(a, g, c).first), 1e-13)
        << sa.str();
  }
}

TEST(TestTritonFusedKernel, TritonKernelWithClipping) {
  for (DType dt : {DType::f64, DType::f32}) {
    const Tensor a = random_normal({5, 4, 6}, dt, {.seed = 3});
    const Tensor g = random_normal({5, 4, 3}, dt, {.seed = 4});
    const Tensor c = random_uniform({5}, dt, {.seed = 5}, 0.05, 1.0);
    EXPECT_LE(rel_err(clipped_weight_grad(a, g, c), naive_clipped(a, g, c).first),
              dt == DType::f64 ? 1e-13 : 1e-5)
        << dtype_name(dt);
  }
}

TEST(TestTritonFusedKernel, TritonKernelBiasHandling) {
  const Tensor a = random_normal({5, 4, 6}, DType::f64, {.seed = 6});
  const Tensor g = random_normal({5, 4, 3}, DType::f64, {.seed = 7});
  const Tensor c = random_uniform({5}, DType::f64, {.seed = 8}, 0.05, 1.0);
  EXPECT_LE(rel_err(clipped_bias_grad(g, c), naive_clipped(a, g, c).second), 1e-13);
  const Tensor g2 = g.reshape({20, 3}).slice(0, 0, 5);  // 2-D: T = 1
  EXPECT_LE(rel_err(clipped_bias_grad(g2, c),
                    naive_clipped(a.reshape({20, 6}).slice(0, 0, 5), g2, c).second),
            1e-13);
}

TEST(TestTritonFusedKernel, ClippedSumOfInstantiatedGrads) {
  const Tensor ps = random_normal({4, 3, 2}, DType::f64, {.seed = 9});
  const Tensor c = Tensor::from_vector<double>({4}, {1.0, 0.5, 0.25, 0.0});
  const Tensor got = clipped_sum(ps, c);
  for (std::int64_t j = 0; j < 6; ++j) {
    EXPECT_NEAR(got.item(j), ps.item(j) + 0.5 * ps.item(6 + j) + 0.25 * ps.item(12 + j), 1e-15);
  }
}

TEST(TestTritonFusedKernel, PerSampleGradsInstantiated) {
  for (const Shape& sa : {Shape{3, 5, 4}, Shape{6, 4}}) {
    const Tensor a = random_normal(sa, DType::f64, {.seed = 14});
    const Tensor g = random_normal(sa.with(sa.rank() - 1, 3), DType::f64, {.seed = 15});
    const Tensor pw = per_sample_weight_grads(a, g);
    const Tensor pb = per_sample_bias_grads(g);
    ASSERT_EQ(pw.shape(), (Shape{sa[0], 3, 4}));
    for (std::int64_t i = 0; i < sa[0]; ++i) {
      EXPECT_LE(rel_err(pw.slice(0, i, 1).reshape({3, 4}), naive_sample_weight_grad(a, g, i)),
                1e-13);
      EXPECT_LE(rel_err(pb.slice(0, i, 1).reshape({3}), naive_sample_bias_grad(g, i)), 1e-13);
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
  for (std::size_t p = 0; p < got.grads.size(); ++p) {
    EXPECT_LE(rel_err(got.grads[p], ref.clipped[p]), 1e-10) << p;
  }
  EXPECT_LE(rel_err(got.coef, test_support::as_tensor(ref.coef)), 1e-10);
}

}  // namespace
}  // namespace meshtest::dp
