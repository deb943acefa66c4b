// Grouped (segmented) GEMM and its backward against per-row loops in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/ops/moe/grouped_gemm.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_ops_grouped_gemm {

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

// reference() as an f64 tensor [rows, out].
Tensor reference_tensor(const Tensor& x, const Offsets& offsets, const Tensor& w,
                        const Tensor* bias) {
  return Tensor::from_vector(Shape{x.shape()[0], w.shape()[1]}, reference(x, offsets, w, bias));
}

// `got` against `want` under the model, with each element's sum of |terms| `scale`.
void expect_within(const Tensor& want, const Tensor& got, const ErrorModel& m, const Tensor& scale,
                   const std::string& what) {
  const Comparison c = compare(want, got, m, scale);
  EXPECT_TRUE(c.passed) << what << ": " << c;
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
    const Tensor mb = magnitude(b);
    for (const bool with_bias : {false, true}) {
      const Tensor* bp = with_bias ? &b : nullptr;
      // One sum of `in` products (+ the bias) per element; each element's sum of |terms| from
      // the loops on |inputs|.
      const std::int64_t terms = c.in + (with_bias ? 1 : 0);
      const Tensor scale =
          reference_tensor(magnitude(x), c.offsets, magnitude(w), with_bias ? &mb : nullptr);
      const Tensor y = grouped_gemm(x, c.offsets, w, with_bias ? b : Tensor());
      ASSERT_EQ(y.shape(), (Shape{rows, c.out}));
      EXPECT_EQ(y.dtype(), DType::f64);
      expect_within(reference_tensor(x, c.offsets, w, bp), y,
                    {.dtype = DType::f64, .terms = terms, .reference = Reference::other_order},
                    scale, fmt::format("f64, bias {}", with_bias));
      // f32 against the loops in f64 on the same (f32-rounded) inputs.
      const Tensor x32 = x.astype(DType::f32), w32 = w.astype(DType::f32);
      const Tensor b32 = b.astype(DType::f32);
      const Tensor y32 = grouped_gemm(x32, c.offsets, w32, with_bias ? b32 : Tensor());
      EXPECT_EQ(y32.dtype(), DType::f32);
      expect_within(reference_tensor(x32, c.offsets, w32, with_bias ? &b32 : nullptr), y32,
                    {.dtype = DType::f32, .terms = terms, .reference = Reference::exact}, scale,
                    fmt::format("f32, bias {}", with_bias));
      // bf16 against the loops on the same (bf16-rounded) inputs: the product is summed in f32
      // and rounded to bf16, which the bias sum then reads (r = 1 with a bias).
      const Tensor x16 = x.astype(DType::bf16), w16 = w.astype(DType::bf16);
      const Tensor b16 = b.astype(DType::bf16);
      const Tensor y16 = grouped_gemm(x16, c.offsets, w16, with_bias ? b16 : Tensor());
      EXPECT_EQ(y16.dtype(), DType::bf16);
      expect_within(reference_tensor(x16, c.offsets, w16, with_bias ? &b16 : nullptr), y16,
                    {.dtype = DType::bf16,
                     .terms = terms,
                     .roundings = with_bias ? 1 : 0,
                     .reference = Reference::exact},
                    scale, fmt::format("bf16, bias {}", with_bias));
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
  const std::int64_t in = 8192;
  const Offsets offsets{0, 1, 1, 2};
  const Tensor x = random_normal(Shape{2, in}, DType::f64, {.seed = 2, .stream = 0});
  const Tensor w = random_normal(Shape{3, 4, in}, DType::f64, {.seed = 2, .stream = 1});
  const Tensor b = random_normal(Shape{3, 4}, DType::f64, {.seed = 2, .stream = 2});
  const Tensor mb = magnitude(b);
  expect_within(reference_tensor(x, offsets, w, &b), grouped_gemm(x, offsets, w, b),
                {.dtype = DType::f64, .terms = in + 1, .reference = Reference::other_order},
                reference_tensor(magnitude(x), offsets, magnitude(w), &mb), "hidden 8192");
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

// grouped_gemm_backward with loops in double, as f64 tensors of the gradients' shapes.
GroupedGemmGrads backward_loops(const Tensor& x, const Offsets& offsets, const Tensor& w,
                                const Tensor& go) {
  const std::int64_t rows = x.shape()[0], in = x.shape()[1];
  const std::int64_t groups = w.shape()[0], out = w.shape()[1];
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
  return {.x = Tensor::from_vector(x.shape(), gx),
          .w = Tensor::from_vector(w.shape(), gw),
          .bias = Tensor::from_vector(Shape{groups, out}, gb)};
}

TEST(GroupedGemmBackward, MatchesLoopsAndFiniteDifferences) {
  const Offsets offsets{0, 4, 4, 9, 10, 10};
  const std::int64_t rows = 10, in = 6, out = 3, groups = 5;
  std::int64_t longest = 0;  // the most rows of one group
  for (std::int64_t e = 0; e < groups; ++e) {
    longest = std::max(longest, offsets[e + 1] - offsets[e]);
  }
  const Tensor x = random_normal(Shape{rows, in}, DType::f64, {.seed = 3, .stream = 0});
  const Tensor w = random_normal(Shape{groups, out, in}, DType::f64, {.seed = 3, .stream = 1});
  const Tensor go = random_normal(Shape{rows, out}, DType::f64, {.seed = 3, .stream = 2});
  const GroupedGemmGrads g = grouped_gemm_backward(x, offsets, w, go);
  ASSERT_EQ(g.x.shape(), x.shape());
  ASSERT_EQ(g.w.shape(), w.shape());
  ASSERT_EQ(g.bias.shape(), (Shape{groups, out}));
  const GroupedGemmGrads want = backward_loops(x, offsets, w, go);
  // Each element's sum of |terms|: the loops on |inputs|.
  const GroupedGemmGrads scale = backward_loops(magnitude(x), offsets, magnitude(w), magnitude(go));
  // grad_x sums `out` products per element; grad_w and grad_bias sum over a group's rows.
  const auto check = [&](const GroupedGemmGrads& got, const GroupedGemmGrads& ref, DType dtype,
                         Reference reference) {
    expect_within(ref.x, got.x, {.dtype = dtype, .terms = out, .reference = reference}, scale.x,
                  fmt::format("{} grad_x", dtype));
    expect_within(ref.w, got.w, {.dtype = dtype, .terms = longest, .reference = reference}, scale.w,
                  fmt::format("{} grad_w", dtype));
    expect_within(ref.bias, got.bias, {.dtype = dtype, .terms = longest, .reference = reference},
                  scale.bias, fmt::format("{} grad_bias", dtype));
  };
  check(g, want, DType::f64, Reference::other_order);
  for (const std::int64_t empty : {1, 4}) {  // groups without rows have zero gradients
    for (std::int64_t i = 0; i < out * in; ++i) EXPECT_EQ(g.w.item(empty * out * in + i), 0.0);
    for (std::int64_t o = 0; o < out; ++o) EXPECT_EQ(g.bias.item(empty * out + o), 0.0);
  }
  // Central differences of L = Σ go ⊙ grouped_gemm(x, w, b) at a few entries of w, x and b.
  // L is linear in each entry (no truncation error); rounding L's rows·out-term sum (|L| and
  // its partial sums ≈ 10) gives about u·10·√30 / (2 eps) ≈ 3e-9, 30x below the tolerance.
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
  // f32 against the loops in f64 on the same (f32-rounded) inputs.
  const Tensor x32 = x.astype(DType::f32), w32 = w.astype(DType::f32);
  const Tensor go32 = go.astype(DType::f32);
  check(grouped_gemm_backward(x32, offsets, w32, go32), backward_loops(x32, offsets, w32, go32),
        DType::f32, Reference::exact);
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

}  // namespace test_ops_grouped_gemm
}  // namespace meshtest
