// rms_norm against hand values and its own f32 result.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/ops/rms_norm.hpp"

namespace meshtest {
namespace test_ops_rms_norm {

TEST(RmsNorm, CraftedVectorMatchesHandValue) {
  // mean(x²) = (1 + 4 + 9 + 16) / 4 = 7.5;  1 / sqrt(7.5 + 1e-5) = 0.3651481282381064
  const double inv_rms = 0.3651481282381064;
  const std::vector<double> x{1, 2, 3, 4};
  const std::vector<double> scale{1, 1, 2, 0.5};
  for (DType dt : {DType::f64, DType::f32}) {
    const Tensor y = rms_norm(Tensor::from_vector(Shape{4}, x).astype(dt),
                              Tensor::from_vector(Shape{4}, scale).astype(dt));
    ASSERT_EQ(y.dtype(), dt);
    // The squares and their mean are exact; the eps sum, the square root, the quotient and the
    // product round once each (the scales are powers of two): within 8 ulps of the value.
    const int mantissa = dt == DType::f64 ? 52 : 23;
    for (int i = 0; i < 4; ++i) {
      const double want = x[i] * scale[i] * inv_rms;
      EXPECT_NEAR(y.item(i), want, 8 * std::ldexp(std::abs(want), -mantissa)) << i;
    }
  }
}

TEST(RmsNorm, RowsAreIndependentOverLeadingDims) {
  const std::int64_t h = 8;
  const Tensor x = random_normal(Shape{2, 3, h}, DType::f64, {.seed = 4, .stream = 0});
  const Tensor s = random_uniform(Shape{h}, DType::f64, {.seed = 4, .stream = 1}, 0.5, 1.5);
  const Tensor y = rms_norm(x, s);
  ASSERT_EQ(y.shape(), x.shape());
  std::vector<double> want;
  for (std::int64_t r = 0; r < 6; ++r) {
    double ms = 0;
    for (std::int64_t i = 0; i < h; ++i) ms += x.item(r * h + i) * x.item(r * h + i) / h;
    for (std::int64_t i = 0; i < h; ++i) {
      want.push_back(x.item(r * h + i) / std::sqrt(ms + 1e-5) * s.item(i));
    }
  }
  // The h squares of a row's mean in Eigen's order against the loop's, then the eps sum, the
  // square root, the quotient and the scale product (one rounding each).
  const Comparison c =
      compare(Tensor::from_vector(x.shape(), want), y,
              ErrorModel{.dtype = DType::f64, .terms = h + 4, .reference = Reference::other_order});
  EXPECT_TRUE(c.passed) << c;
}

TEST(RmsNorm, Bf16IsTheF32ResultRounded) {
  const Tensor x = random_normal(Shape{5, 16}, DType::bf16, {.seed = 5, .stream = 0}, 0, 3);
  const Tensor s = random_uniform(Shape{16}, DType::f32, {.seed = 5, .stream = 1}, 0.5, 1.5);
  const Tensor y = rms_norm(x, s);
  ASSERT_EQ(y.dtype(), DType::bf16);
  EXPECT_TRUE(y.bitwise_equal(rms_norm(x.astype(DType::f32), s).astype(DType::bf16)));
  // The scale may be bf16 too (a bf16 checkpoint).
  EXPECT_EQ(rms_norm(x, s.astype(DType::bf16)).dtype(), DType::bf16);
}

TEST(RmsNorm, ZeroRowStaysFiniteAndEpsIsUsed) {
  const Tensor y = rms_norm(Tensor(Shape{2, 4}, DType::f32),
                            Tensor::from_vector(Shape{4}, std::vector<float>{1, 1, 1, 1}));
  for (std::int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y.item(i), 0.0);
  // A constant row c: c / sqrt(c² + eps).
  const Tensor c = rms_norm(Tensor::from_vector(Shape{2}, std::vector<double>{1e-3, 1e-3}),
                            Tensor::from_vector(Shape{2}, std::vector<double>{1, 1}), 1e-6);
  // A handful of roundings (the squares, their mean, eps, sqrt, quotient): within 8 ulps.
  const double want = 1e-3 / std::sqrt(1e-6 + 1e-6);
  EXPECT_NEAR(c.item(0), want, 8 * std::ldexp(want, -52));
}

TEST(RmsNorm, BadInputThrows) {
  const Tensor x(Shape{2, 4}, DType::f32);
  EXPECT_THROW(rms_norm(x, Tensor(Shape{3}, DType::f32)), Error);
  EXPECT_THROW(rms_norm(x, Tensor(Shape{4}, DType::i32)), Error);
  EXPECT_THROW(rms_norm(Tensor(Shape{2, 4}, DType::i64), Tensor(Shape{4}, DType::f32)), Error);
  EXPECT_THROW(rms_norm(x, Tensor(Shape{4}, DType::f32), -1.0), Error);
}

}  // namespace test_ops_rms_norm
}  // namespace meshtest
