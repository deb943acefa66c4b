// Grouped (segmented) GEMM and its backward against per-row loops in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "src/core/random.hpp"
#include "src/ops/grouped_gemm.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace {

using test_support::expect_error;
using Offsets = std::vector<std::int64_t>;

// The group of row r under offsets.
std::int64_t group_of(const Offsets& offsets, std::int64_t r) {
  std::int64_t e = 0;
  while (offsets[e + 1] <= r) ++e;
  return e;
}

// out[r, o] = Σ_i x[r, i] w[e, o, i] (+ bias[e, o]), e the group of row r.
std::vector<double> reference(const Tensor& x, const Offsets& offsets, const Tensor& w,
                              const Tensor* bias) {
  const std::int64_t rows = x.shape()[0], in = x.shape()[1], out = w.shape()[1];
  std::vector<double> y(static_cast<std::size_t>(rows * out));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t e = group_of(offsets, r);
    for (std::int64_t o = 0; o < out; ++o) {
      double s = bias != nullptr ? bias->item(e * out + o) : 0.0;
      for (std::int64_t i = 0; i < in; ++i)
        s += x.item(r * in + i) * w.item((e * out + o) * in + i);
      y[r * out + o] = s;
    }
  }
  return y;
}

// max |a - b| / (1 + |b|) over the elements.
double max_rel(const Tensor& a, const std::vector<double>& b) {
  EXPECT_EQ(a.numel(), static_cast<std::int64_t>(b.size()));
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    m = std::max(m, std::abs(a.item(i) - b[i]) / (1 + std::abs(b[i])));
  }
  return m;
}

// max |a - b| / (1 + max |b|): bf16 rounds each product and sum to 2^-8 of its magnitude.
double max_scaled(const Tensor& a, const std::vector<double>& b) {
  double m = 0, scale = 1;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    m = std::max(m, std::abs(a.item(i) - b[i]));
    scale = std::max(scale, 1 + std::abs(b[i]));
  }
  return m / scale;
}

struct Case {
  std::int64_t in, out;
  Offsets offsets;
};

TEST(GroupedGemm, MatchesLoopsWithEmptySegmentsInEveryDtype) {
  const std::vector<Case> cases{
      {7, 5, {0, 0, 3, 3, 9, 13, 13}},  // empty first, middle and last segments
      {16, 12, {0, 40}},                // one group: a dense GEMM
      {3, 9, {0, 1, 2, 3, 4}},          // one row each
      {5, 4, {0, 0, 0, 11}},            // every row to the last group (skewed)
      {6, 3, {0, 0, 0}},                // no rows
  };
  for (const Case& c : cases) {
    const auto groups = static_cast<std::int64_t>(c.offsets.size()) - 1;
    const std::int64_t rows = c.offsets.back();
    SCOPED_TRACE(testing::Message()
                 << "in " << c.in << " out " << c.out << " groups " << groups << " rows " << rows);
    const Tensor x = random_normal(Shape{rows, c.in}, DType::f64, {.seed = 1, .stream = 0});
    const Tensor w =
        random_normal(Shape{groups, c.out, c.in}, DType::f64, {.seed = 1, .stream = 1});
    const Tensor b = random_normal(Shape{groups, c.out}, DType::f64, {.seed = 1, .stream = 2});
    for (const bool with_bias : {false, true}) {
      const Tensor* bp = with_bias ? &b : nullptr;
      const std::vector<double> want = reference(x, c.offsets, w, bp);
      const Tensor y = grouped_gemm(x, c.offsets, w, with_bias ? b : Tensor());
      ASSERT_EQ(y.shape(), (Shape{rows, c.out}));
      EXPECT_EQ(y.dtype(), DType::f64);
      EXPECT_LE(max_rel(y, want), 1e-14) << "bias " << with_bias;
      const Tensor y32 = grouped_gemm(x.astype(DType::f32), c.offsets, w.astype(DType::f32),
                                      with_bias ? b.astype(DType::f32) : Tensor());
      EXPECT_EQ(y32.dtype(), DType::f32);
      EXPECT_LE(max_rel(y32, want), 1e-5) << "f32, bias " << with_bias;
      // bf16 against loops on the same (bf16-rounded) inputs, to bf16 precision.
      const Tensor x16 = x.astype(DType::bf16), w16 = w.astype(DType::bf16);
      const Tensor b16 = b.astype(DType::bf16);
      const Tensor y16 = grouped_gemm(x16, c.offsets, w16, with_bias ? b16 : Tensor());
      EXPECT_EQ(y16.dtype(), DType::bf16);
      const Tensor* b16p = with_bias ? &b16 : nullptr;
      EXPECT_LE(max_scaled(y16, reference(x16, c.offsets, w16, b16p)), 1.0 / 64) << "bf16";
    }
  }
}

TEST(GroupedGemm, Bf16RoundsTheProductThenTheBiasSum) {
  // One row, one output: x·w = 1 + 2^-8 (exact in f32, halfway between bf16 1 and 1 + 2^-7,
  // rounds to even: 1), then + bias 2^-8 -> 1 + 2^-8 again, rounds to 1. Rounding only the
  // final sum (1 + 2^-7) would give 1 + 2^-7.
  const double half_ulp = std::ldexp(1.0, -8);
  const Tensor x =
      Tensor::from_vector(Shape{1, 2}, std::vector<double>{1, half_ulp}).astype(DType::bf16);
  const Tensor w =
      Tensor::from_vector(Shape{1, 1, 2}, std::vector<double>{1, 1}).astype(DType::bf16);
  const Tensor b =
      Tensor::from_vector(Shape{1, 1}, std::vector<double>{half_ulp}).astype(DType::bf16);
  EXPECT_EQ(grouped_gemm(x, Offsets{0, 1}, w, b).item(0), 1.0);
  EXPECT_EQ(
      grouped_gemm(x.astype(DType::f32), Offsets{0, 1}, w.astype(DType::f32), b.astype(DType::f32))
          .item(0),
      1 + 2 * half_ulp);
}

TEST(GroupedGemm, HiddenOf8192WithTwoTokens) {
  const Offsets offsets{0, 1, 1, 2};
  const Tensor x = random_normal(Shape{2, 8192}, DType::f64, {.seed = 2, .stream = 0});
  const Tensor w = random_normal(Shape{3, 4, 8192}, DType::f64, {.seed = 2, .stream = 1});
  const Tensor b = random_normal(Shape{3, 4}, DType::f64, {.seed = 2, .stream = 2});
  EXPECT_LE(max_rel(grouped_gemm(x, offsets, w, b), reference(x, offsets, w, &b)), 1e-12);
}

TEST(GroupedGemm, BadInputThrows) {
  const Tensor x(Shape{5, 4}, DType::f32);
  const Tensor w(Shape{3, 2, 4}, DType::f32);
  expect_error(
      [&] {
        grouped_gemm(x, Offsets{0, 2, 5}, w);
      },
      {"3 offsets for 3 groups", "expected 4"});
  expect_error([&] { grouped_gemm(x, Offsets{1, 2, 3, 5}, w); }, {"offsets run from 1 to 5"});
  expect_error(
      [&] {
        grouped_gemm(x, Offsets{0, 2, 3, 4}, w);
      },
      {"offsets run from 0 to 4", "rows of x"});
  expect_error([&] { grouped_gemm(x, Offsets{0, 3, 2, 5}, w); }, {"offsets decrease at group 1"});
  expect_error(
      [&] {
        grouped_gemm(x, Offsets{0, 2, 3, 5}, Tensor(Shape{3, 2, 5}, DType::f32));
      },
      {"w has shape [3, 2, 5]", "in = 4"});
  expect_error([&] { grouped_gemm(x, Offsets{0, 2, 3, 5}, w.astype(DType::f64)); }, {"w", "f64"});
  expect_error(
      [&] {
        grouped_gemm(x, Offsets{0, 2, 3, 5}, w, Tensor(Shape{3, 4}, DType::f32));
      },
      {"bias", "[3, 2]"});
  expect_error(
      [&] {
        grouped_gemm(x, Offsets{0, 2, 3, 5}, w, Tensor(Shape{3, 2}, DType::f64));
      },
      {"bias", "f64"});
  expect_error(
      [&] {
        grouped_gemm(Tensor(Shape{20}, DType::f32), Offsets{0, 2, 3, 5}, w);
      },
      {"x ([rows, in])"});
  expect_error(
      [&] {
        grouped_gemm(x.astype(DType::i64), Offsets{0, 2, 3, 5}, w.astype(DType::i64));
      },
      {"dtype i64 is not supported"});
}

TEST(GroupedGemmBackward, MatchesLoopsAndFiniteDifferences) {
  const Offsets offsets{0, 4, 4, 9, 10, 10};
  const std::int64_t rows = 10, in = 6, out = 3, groups = 5;
  const Tensor x = random_normal(Shape{rows, in}, DType::f64, {.seed = 3, .stream = 0});
  const Tensor w = random_normal(Shape{groups, out, in}, DType::f64, {.seed = 3, .stream = 1});
  const Tensor go = random_normal(Shape{rows, out}, DType::f64, {.seed = 3, .stream = 2});
  const GroupedGemmGrads g = grouped_gemm_backward(x, offsets, w, go);
  ASSERT_EQ(g.x.shape(), x.shape());
  ASSERT_EQ(g.w.shape(), w.shape());
  ASSERT_EQ(g.bias.shape(), (Shape{groups, out}));
  std::vector<double> gx(static_cast<std::size_t>(rows * in), 0.0);
  std::vector<double> gw(static_cast<std::size_t>(groups * out * in), 0.0);
  std::vector<double> gb(static_cast<std::size_t>(groups * out), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t e = group_of(offsets, r);
    for (std::int64_t o = 0; o < out; ++o) {
      gb[e * out + o] += go.item(r * out + o);
      for (std::int64_t i = 0; i < in; ++i) {
        gx[r * in + i] += go.item(r * out + o) * w.item((e * out + o) * in + i);
        gw[(e * out + o) * in + i] += go.item(r * out + o) * x.item(r * in + i);
      }
    }
  }
  EXPECT_LE(max_rel(g.x, gx), 1e-14);
  EXPECT_LE(max_rel(g.w, gw), 1e-14);
  EXPECT_LE(max_rel(g.bias, gb), 1e-14);
  for (const std::int64_t empty : {1, 4}) {  // groups without rows have zero gradients
    for (std::int64_t i = 0; i < out * in; ++i) EXPECT_EQ(g.w.item(empty * out * in + i), 0.0);
    for (std::int64_t o = 0; o < out; ++o) EXPECT_EQ(g.bias.item(empty * out + o), 0.0);
  }
  // Central differences of L = Σ go ⊙ grouped_gemm(x, w, b) at a few entries of w, x and b.
  const Tensor b = random_normal(Shape{groups, out}, DType::f64, {.seed = 3, .stream = 3});
  const auto loss = [&](const Tensor& xx, const Tensor& ww, const Tensor& bb) {
    const Tensor y = grouped_gemm(xx, offsets, ww, bb);
    double s = 0;
    for (std::int64_t i = 0; i < y.numel(); ++i) s += go.item(i) * y.item(i);
    return s;
  };
  const double eps = 1e-6;
  const auto fd = [&](int which, std::int64_t i) {
    Tensor p[3] = {x, w, b};
    Tensor m[3] = {x, w, b};
    p[which].vector<double>()(i) += eps;
    m[which].vector<double>()(i) -= eps;
    return (loss(p[0], p[1], p[2]) - loss(m[0], m[1], m[2])) / (2 * eps);
  };
  for (const std::int64_t i : {0L, 7L, 59L}) EXPECT_NEAR(fd(0, i), g.x.item(i), 1e-7) << i;
  for (const std::int64_t i : {0L, 20L, 50L, 89L}) EXPECT_NEAR(fd(1, i), g.w.item(i), 1e-7) << i;
  for (const std::int64_t i : {2L, 7L, 12L}) EXPECT_NEAR(fd(2, i), g.bias.item(i), 1e-7) << i;
  // f32 follows f64.
  const GroupedGemmGrads g32 = grouped_gemm_backward(x.astype(DType::f32), offsets,
                                                     w.astype(DType::f32), go.astype(DType::f32));
  EXPECT_LE(max_rel(g32.x, gx), 1e-5);
  EXPECT_LE(max_rel(g32.w, gw), 1e-5);
  EXPECT_LE(max_rel(g32.bias, gb), 1e-5);
}

TEST(GroupedGemmBackward, EdgeSizesAndBadInput) {
  // No rows: zero weight and bias gradients.
  const Tensor w = random_normal(Shape{2, 3, 4}, DType::f32, {.seed = 4});
  const GroupedGemmGrads g0 = grouped_gemm_backward(
      Tensor(Shape{0, 4}, DType::f32), Offsets{0, 0, 0}, w, Tensor(Shape{0, 3}, DType::f32));
  EXPECT_EQ(g0.x.shape(), (Shape{0, 4}));
  EXPECT_TRUE(g0.w.bitwise_equal(Tensor(Shape{2, 3, 4}, DType::f32)));
  EXPECT_TRUE(g0.bias.bitwise_equal(Tensor(Shape{2, 3}, DType::f32)));
  const Tensor x(Shape{2, 4}, DType::f32);
  expect_error(
      [&] {
        grouped_gemm_backward(x, Offsets{0, 1, 2}, w, Tensor(Shape{2, 4}, DType::f32));
      },
      {"grad_out", "[2, 3]"});
  expect_error(
      [&] {
        grouped_gemm_backward(x, Offsets{0, 1, 2}, w, Tensor(Shape{2, 3}, DType::f64));
      },
      {"grad_out", "f64"});
  expect_error(
      [&] {
        grouped_gemm_backward(x, Offsets{0, 2}, w, Tensor(Shape{2, 3}, DType::f32));
      },
      {"2 offsets for 2 groups"});
  expect_error(
      [&] {
        grouped_gemm_backward(x.astype(DType::bf16), Offsets{0, 1, 2}, w.astype(DType::bf16),
                              Tensor(Shape{2, 3}, DType::bf16));
      },
      {"dtype bf16 is not supported (expected f32 or f64)"});
}

}  // namespace
}  // namespace meshtest
