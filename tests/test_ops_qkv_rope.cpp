// qkv_rope (qkv Linear + split + RoPE in one pass) against the attention block's own sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "src/check/metrics.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/ops/attention.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/qkv_rope.hpp"
#include "src/ops/rope.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_ops_qkv_rope {

using test_support::expect_error;

// The reference: the sequence attention_block runs (linear, split_qkv, rope).
Qkv qkv_rope_reference(const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const QkvRopeOptions& o) {
  Qkv qkv = split_qkv(linear(x, weight, bias), o.num_heads, o.num_kv_heads, o.rope.head_dim);
  auto [q, k] = rope(qkv.q, qkv.k, o.rope, o.position_offset);
  return {std::move(q), std::move(k), std::move(qkv.v)};
}

// Sizes of one problem; hidden is the Linear's input width.
struct Case {
  std::int64_t tokens, hidden, heads, kv_heads, d;
};

struct Weights {
  Tensor x, weight, bias;
};

std::int64_t qkv_dim(const Case& c) { return (c.heads + 2 * c.kv_heads) * c.d; }

// Small integers: every GEMM sum is exact in f32 (and every value exact in bf16), so the
// summation order cannot matter and the fused op must equal the reference bit for bit.
Weights integer_weights(const Case& c, DType dt, std::uint64_t seed) {
  return {random_integers(Shape{c.tokens, c.hidden}, dt, {.seed = seed, .stream = 0}, -3, 3),
          random_integers(Shape{qkv_dim(c), c.hidden}, dt, {.seed = seed, .stream = 1}, -2, 2),
          random_integers(Shape{qkv_dim(c)}, dt, {.seed = seed, .stream = 2}, -4, 4)};
}

// Normal values scaled so that the outputs are O(1).
Weights normal_weights(const Case& c, DType dt, std::uint64_t seed) {
  const double w_std = 1.0 / std::sqrt(static_cast<double>(c.hidden));
  return {random_normal(Shape{c.tokens, c.hidden}, dt, {.seed = seed, .stream = 0}),
          random_normal(Shape{qkv_dim(c), c.hidden}, dt, {.seed = seed, .stream = 1}, 0, w_std),
          random_normal(Shape{qkv_dim(c)}, dt, {.seed = seed, .stream = 2}, 0, 0.1)};
}

QkvRopeOptions options(const Case& c, std::int64_t offset, std::int64_t row_block,
                       std::int64_t column_block) {
  RopeParams rope;
  rope.head_dim = c.d;
  return {.num_heads = c.heads,
          .num_kv_heads = c.kv_heads,
          .rope = rope,
          .position_offset = offset,
          .row_block = row_block,
          .column_block = column_block};
}

std::string describe(const Case& c, const QkvRopeOptions& o, DType dt) {
  return "T " + std::to_string(c.tokens) + ", hidden " + std::to_string(c.hidden) + ", heads " +
         std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + ", d " + std::to_string(c.d) +
         ", offset " + std::to_string(o.position_offset) + ", row_block " +
         std::to_string(o.row_block) + ", column_block " + std::to_string(o.column_block) + ", " +
         std::string(dtype_name(dt));
}

// Cases: decode, prefill not a multiple of the panels, GQA and MHA, d 8 and 16.
const std::vector<Case> kCases = {
    {1, 24, 4, 2, 8}, {13, 24, 4, 2, 8}, {70, 40, 3, 3, 16}, {64, 17, 8, 1, 8}};

// Runs both on every case, offset and tiling; `check(want, got, what, case)` compares one output
// tensor.
template <class Make, class Check>
void for_each_config(DType dt, Make make, Check check) {
  std::uint64_t seed = 20;
  for (const Case& c : kCases) {
    const Weights w = make(c, dt, ++seed);
    for (std::int64_t offset : {0, 5, 4097}) {
      for (std::int64_t row_block : {1, 7, 64}) {
        for (std::int64_t column_block : {c.d, 3 * c.d + 1, std::int64_t{2048}}) {
          const QkvRopeOptions o = options(c, offset, row_block, column_block);
          const Qkv want = qkv_rope_reference(w.x, w.weight, w.bias, o);
          const Qkv got = qkv_rope(w.x, w.weight, w.bias, o);
          const std::string what = describe(c, o, dt);
          check(want.q, got.q, "q, " + what, c);
          check(want.k, got.k, "k, " + what, c);
          check(want.v, got.v, "v, " + what, c);
        }
      }
    }
  }
}

void expect_bitwise(const Tensor& want, const Tensor& got, const std::string& what, const Case&) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  EXPECT_TRUE(got.bitwise_equal(want)) << what << ": max error " << max_abs_error(want, got);
}

TEST(QkvRope, ExactInputsMatchTheReferenceBitForBit) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for_each_config(dt, integer_weights, expect_bitwise);
  }
}

TEST(QkvRope, NormalInputsMatchTheReference) {
  // Only the GEMM's summation order differs (panels and weight blocks; a 1-row panel takes
  // Eigen's matrix-vector path), then the same rotation: within the error model, n = the linear
  // over hidden and its bias, then rope's two products, with the tensor scale max |want|
  // (zero-mean normal inputs: RoPE's x1 cos - x2 sin of independent values cancels no more than
  // the terms' partial sums do).
  for (DType dt : {DType::f32, DType::f64}) {
    for_each_config(
        dt, normal_weights,
        [&](const Tensor& want, const Tensor& got, const std::string& what, const Case& c) {
          ASSERT_EQ(got.shape(), want.shape()) << what;
          const ErrorModel m{
              .dtype = dt, .terms = c.hidden + 1 + 2, .reference = Reference::other_order};
          const Comparison r = compare(want, got, m);
          EXPECT_TRUE(r.passed) << what << ": " << r;
        });
  }
}

TEST(QkvRope, PositionZeroIsTheBiasedProjectionTimesTheConcentration) {
  // At position 0 every angle is 0: cos = concentration (0.1 ln 32 + 1), sin = 0. With x = e_0
  // the projection is column 0 of the weight plus the bias.
  const Case c{1, 5, 2, 1, 8};
  Tensor x(Shape{1, 5}, DType::f64);
  x.span<double>()[0] = 1;
  const Weights w = normal_weights(c, DType::f64, 3);
  const Qkv got = qkv_rope(x, w.weight, w.bias, options(c, 0, 64, 2048));
  const double concentration = 0.1 * std::log(32.0) + 1;
  const auto projection = [&](std::int64_t col) {
    return w.weight.item(col * c.hidden) + w.bias.item(col);
  };
  // Both sides round w + b, then its product by the concentration (sin 0 = 0 adds nothing): a
  // closed form of two f64 operations, 4 ulps of the value whatever contracts into an FMA.
  const auto ulps4 = [](double want) { return 4 * std::ldexp(std::abs(want), -52); };
  for (std::int64_t i = 0; i < 2 * 8; ++i) {
    const double want = concentration * projection(i);
    EXPECT_NEAR(got.q.item(i), want, ulps4(want)) << i;
  }
  for (std::int64_t i = 0; i < 8; ++i) {
    const double want = concentration * projection(16 + i);
    EXPECT_NEAR(got.k.item(i), want, ulps4(want)) << i;
    EXPECT_EQ(got.v.item(i), projection(24 + i)) << i;
  }
}

TEST(QkvRope, NoTokensGiveEmptyOutputs) {
  const Case c{0, 24, 4, 2, 8};
  const Weights w = normal_weights(c, DType::f32, 4);
  const Qkv got = qkv_rope(w.x, w.weight, w.bias, options(c, 9, 64, 2048));
  const Qkv want = qkv_rope_reference(w.x, w.weight, w.bias, options(c, 9, 64, 2048));
  EXPECT_EQ(got.q.shape(), (Shape{0, 2, 2, 8}));
  EXPECT_EQ(got.q.shape(), want.q.shape());
  EXPECT_EQ(got.k.shape(), (Shape{0, 2, 8}));
  EXPECT_EQ(got.v.shape(), want.v.shape());
}

TEST(QkvRope, BadInputNamesTheProblem) {
  const Case c{3, 24, 4, 2, 8};
  const Weights w = normal_weights(c, DType::f32, 5);
  const QkvRopeOptions o = options(c, 0, 64, 2048);
  const auto run = [&](const QkvRopeOptions& opt, const Tensor& x, const Tensor& weight,
                       const Tensor& bias) { return qkv_rope(x, weight, bias, opt); };
  expect_error(
      [&] {
        run(o, w.x.reshape(Shape{3, 4, 6}), w.weight, w.bias);
      },
      {"qkv_rope: x ([T, hidden]) has shape [3, 4, 6]"});
  expect_error([&] { run(o, w.x, w.weight.slice(0, 0, 56), w.bias); },
               {"qkv_rope: weight", "has shape [56, 24], expected [64, 24]"});
  expect_error([&] { run(o, w.x, w.weight.slice(1, 0, 20), w.bias); }, {"expected [64, 24]"});
  expect_error([&] { run(o, w.x, w.weight, w.bias.slice(0, 0, 63)); },
               {"bias has shape [63], expected [64]"});
  expect_error([&] { run(o, w.x, w.weight.astype(DType::bf16), w.bias); },
               {"weight has dtype bf16, expected f32"});
  expect_error([&] { run(o, w.x, w.weight, w.bias.astype(DType::f64)); }, {"bias has dtype f64"});
  const auto i32 = [](const Tensor& t) { return t.astype(DType::i32); };
  expect_error([&] { run(o, i32(w.x), i32(w.weight), i32(w.bias)); },
               {"qkv_rope: dtype i32 is not supported"});
  QkvRopeOptions bad = o;
  bad.num_kv_heads = 3;
  expect_error([&] { run(bad, w.x, w.weight, w.bias); },
               {"num_heads 4 must be a positive multiple of num_kv_heads 3"});
  bad = o;
  bad.num_heads = 0;
  expect_error([&] { run(bad, w.x, w.weight, w.bias); }, {"num_heads 0"});
  bad = o;
  bad.rope.head_dim = 7;
  expect_error([&] { run(bad, w.x, w.weight, w.bias); }, {"rope.head_dim is 7"});
  bad = o;
  bad.position_offset = -1;
  expect_error([&] { run(bad, w.x, w.weight, w.bias); }, {"position_offset is -1"});
  bad = o;
  bad.row_block = 0;
  expect_error([&] { run(bad, w.x, w.weight, w.bias); }, {"row_block 0"});
  bad = o;
  bad.column_block = 0;
  expect_error([&] { run(bad, w.x, w.weight, w.bias); }, {"column_block 0"});
  bad = o;
  bad.rope.theta = 0.5;  // rope's own parameter check
  expect_error([&] { run(bad, w.x, w.weight, w.bias); }, {"rope: theta is 0.5"});
}

}  // namespace test_ops_qkv_rope
}  // namespace meshtest
