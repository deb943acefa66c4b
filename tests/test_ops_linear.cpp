// linear, embedding and add against naive loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "src/check/metrics.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/ops/elementwise.hpp"
#include "src/ops/embedding.hpp"
#include "src/ops/linear.hpp"

namespace meshtest {
namespace test_ops_linear {

// y[r, o] = sum_i x[r, i] w[o, i] + b[o], in double over the flat rows of x.
std::vector<double> naive_linear(const Tensor& x, const Tensor& w, const Tensor* b) {
  const std::int64_t out = w.shape()[0];
  const std::int64_t in = w.shape()[1];
  const std::int64_t rows = x.numel() / in;
  std::vector<double> y(static_cast<std::size_t>(rows * out));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t o = 0; o < out; ++o) {
      double acc = b != nullptr ? b->item(o) : 0.0;
      for (std::int64_t i = 0; i < in; ++i) acc += x.item(r * in + i) * w.item(o * in + i);
      y[r * out + o] = acc;
    }
  }
  return y;
}

TEST(Linear, MatchesNaiveLoopWithLeadingDims) {
  const std::int64_t in = 5;
  for (DType dt : {DType::f64, DType::f32}) {
    const Tensor x = random_normal(Shape{2, 3, in}, dt, {.seed = 1, .stream = 0});
    const Tensor w = random_normal(Shape{4, in}, dt, {.seed = 1, .stream = 1});
    const Tensor b = random_normal(Shape{4}, dt, {.seed = 1, .stream = 2});
    const Tensor y = linear(x, w, b);
    EXPECT_EQ(y.shape(), (Shape{2, 3, 4}));
    EXPECT_EQ(y.dtype(), dt);
    // One sum of `in` products (+ the bias) per element, in Eigen's order against the loop's:
    // f64 against f64 in another order, f32 against the loop in f64 on the same inputs.
    const Reference ref = dt == DType::f64 ? Reference::other_order : Reference::exact;
    const Comparison with_bias = compare(Tensor::from_vector(y.shape(), naive_linear(x, w, &b)), y,
                                         ErrorModel{.dtype = dt, .terms = in + 1, .reference = ref},
                                         linear(magnitude(x), magnitude(w), magnitude(b)));
    EXPECT_TRUE(with_bias.passed) << dtype_name(dt) << " with bias: " << with_bias;
    const Comparison no_bias = compare(
        Tensor::from_vector(y.shape(), naive_linear(x, w, nullptr)), linear(x, w),
        ErrorModel{.dtype = dt, .terms = in, .reference = ref}, linear(magnitude(x), magnitude(w)));
    EXPECT_TRUE(no_bias.passed) << dtype_name(dt) << " without bias: " << no_bias;
  }
}

TEST(Linear, Bf16RoundsTheF32ResultOnceAcrossWeightBlocks) {
  // out = 2050 crosses the 2048-row weight block of the bf16 path.
  const std::int64_t in = 7;
  const Tensor x = random_normal(Shape{3, in}, DType::bf16, {.seed = 2, .stream = 0});
  const Tensor w = random_normal(Shape{2050, in}, DType::bf16, {.seed = 2, .stream = 1});
  const Tensor b = random_normal(Shape{2050}, DType::bf16, {.seed = 2, .stream = 2});
  const Tensor y = linear(x, w, b);
  ASSERT_EQ(y.dtype(), DType::bf16);
  const Tensor want = linear(x.astype(DType::f64), w.astype(DType::f64), b.astype(DType::f64));
  // in products and the bias summed in f32, then one rounding to bf16 (r = 0: no bf16 value is
  // read inside the op); rounding the product to bf16 before the bias sum exceeds the bound.
  const Comparison c = compare(
      want, y, ErrorModel{.dtype = DType::bf16, .terms = in + 1, .reference = Reference::exact},
      linear(magnitude(x), magnitude(w), magnitude(b)));
  EXPECT_TRUE(c.passed) << c;
}

TEST(Linear, BadInputThrows) {
  const Tensor x(Shape{2, 5}, DType::f32);
  EXPECT_THROW(linear(x, Tensor(Shape{4, 6}, DType::f32)), Error);
  EXPECT_THROW(linear(x, Tensor(Shape{4, 5}, DType::f64)), Error);
  EXPECT_THROW(linear(x, Tensor(Shape{4, 5}, DType::f32), Tensor(Shape{5}, DType::f32)), Error);
  EXPECT_THROW(linear(x, Tensor(Shape{4, 5}, DType::f32), Tensor(Shape{4}, DType::bf16)), Error);
  EXPECT_THROW(linear(Tensor(Shape{2, 5}, DType::i32), Tensor(Shape{4, 5}, DType::i32)), Error);
  try {
    linear(x, Tensor(Shape{4, 6}, DType::f32));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 6]"), std::string::npos) << e.what();
  }
}

TEST(Linear, EmptyRowsGiveEmptyOutput) {
  const Tensor y = linear(Tensor(Shape{0, 5}, DType::f32), Tensor(Shape{4, 5}, DType::f32));
  EXPECT_EQ(y.shape(), (Shape{0, 4}));
}

TEST(Embedding, CopiesRowsAndRejectsBadIds) {
  const Tensor table = random_normal(Shape{6, 3}, DType::bf16, {.seed = 3, .stream = 0});
  const std::vector<std::int64_t> ids{5, 0, 5, 2};
  const Tensor x = embedding(ids, table);
  ASSERT_EQ(x.shape(), (Shape{4, 3}));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_TRUE(
        x.slice(0, static_cast<std::int64_t>(i), 1).bitwise_equal(table.slice(0, ids[i], 1)));
  }
  EXPECT_EQ(embedding(std::vector<std::int64_t>{}, table).shape(), (Shape{0, 3}));
  EXPECT_THROW(embedding(std::vector<std::int64_t>{1, 6}, table), Error);
  EXPECT_THROW(embedding(std::vector<std::int64_t>{-1}, table), Error);
}

TEST(Add, AddsAndRoundsOnce) {
  const Tensor a = Tensor::from_vector(Shape{3}, std::vector<double>{1, 2.5, -4});
  const Tensor b = Tensor::from_vector(Shape{3}, std::vector<double>{0.5, -2.5, 1e-3});
  const Tensor s = add(a, b);
  EXPECT_EQ(s.item(0), 1.5);
  EXPECT_EQ(s.item(1), 0.0);
  EXPECT_EQ(s.item(2), -4 + 1e-3);
  // bf16: 256 + 1 is not representable (8 bits of mantissa) and rounds to even (256).
  const Tensor big = Tensor::from_vector(Shape{1}, std::vector<float>{256}).astype(DType::bf16);
  const Tensor one = Tensor::from_vector(Shape{1}, std::vector<float>{1}).astype(DType::bf16);
  EXPECT_EQ(add(big, one).item(0), 256.0);
  EXPECT_THROW(add(a, b.astype(DType::f32)), Error);
  EXPECT_THROW(add(a, Tensor(Shape{4}, DType::f64)), Error);
}

}  // namespace test_ops_linear
}  // namespace meshtest
