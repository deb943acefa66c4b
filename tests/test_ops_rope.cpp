// RoPE with YaRN against closed forms written independently here.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "src/core/random.hpp"
#include "src/ops/rope.hpp"

namespace meshtest {
namespace test_ops_rope {

struct Yarn {
  double concentration;
  double low;
  double high;
  std::vector<double> inv_freq;
};

// The YaRN definitions (docs/gpt-oss.md) in plain double loops.
Yarn reference_yarn(int d, double base, double s, double ctx, double alpha, double beta) {
  Yarn y;
  y.concentration = 0.1 * std::log(s) + 1;
  y.low = (d / 2.0) * std::log(ctx / (beta * 2 * std::numbers::pi)) / std::log(base);
  y.high = (d / 2.0) * std::log(ctx / (alpha * 2 * std::numbers::pi)) / std::log(base);
  for (int j = 0; j < d / 2; ++j) {
    const double freq = std::pow(base, 2.0 * j / d);
    double ramp = (j - y.low) / (y.high - y.low);
    ramp = ramp < 0 ? 0 : (ramp > 1 ? 1 : ramp);
    const double mask = 1 - ramp;
    y.inv_freq.push_back(1 / (s * freq) * (1 - mask) + 1 / freq * mask);
  }
  return y;
}

RopeParams tiny_rope() {
  RopeParams p;
  p.head_dim = 16;
  return p;
}

TEST(Yarn, InvFreqMatchesClosedFormForSmallHeadDim) {
  const RopeParams p = tiny_rope();
  const Yarn want = reference_yarn(16, 150000, 32, 4096, 1, 32);
  const YarnFrequencies got = yarn_frequencies(p, DType::f64);
  // Closed forms of a few log, pow and quotients (no sums): EXPECT_DOUBLE_EQ allows 4 ulps, the
  // absolute tolerances below are 14 ulps of the value or more.
  EXPECT_DOUBLE_EQ(got.concentration, 1.3465735902799727);  // 0.1 ln 32 + 1
  EXPECT_NEAR(got.low, 2.0231947788781004, 1e-13);
  EXPECT_NEAR(got.high, 4.34950612539714, 1e-13);
  ASSERT_EQ(got.inv_freq.size(), 8u);
  for (int j = 0; j < 8; ++j) {
    // pow, two quotients and the ramp's blend on each side (FMA may fuse the blend): 8 ulps.
    EXPECT_NEAR(got.inv_freq[j], want.inv_freq[j], 8 * std::ldexp(want.inv_freq[j], -52)) << j;
  }
  // Below low: pure extrapolation 1/freq; above high: pure interpolation 1/(s freq).
  EXPECT_DOUBLE_EQ(got.inv_freq[0], 1.0);
  EXPECT_NEAR(got.inv_freq[2], std::pow(150000.0, -4.0 / 16), 1e-16);
  EXPECT_NEAR(got.inv_freq[7], std::pow(150000.0, -14.0 / 16) / 32, 1e-18);
  // f32 (the reference's precision) agrees to f32 rounding: a relative 1e-6 is 8 f32 ulps or more
  // for the few roundings of powf and the quotients.
  const YarnFrequencies f32 = yarn_frequencies(p, DType::f32);
  for (int j = 0; j < 8; ++j) {
    EXPECT_NEAR(f32.inv_freq[j], want.inv_freq[j], 1e-6 * want.inv_freq[j]) << j;
  }
}

TEST(Yarn, PublishedHeadDimBand) {
  RopeParams p;  // 20b/120b: head_dim 64, theta 150000, s 32, L 4096
  const YarnFrequencies got = yarn_frequencies(p);
  // A few log and quotients, no sums: 1e-12 is hundreds of ulps of low and high, 1e-15 at least
  // 4.5 ulps of inv_freq (<= 1; inv_freq[0] = 1 exactly).
  EXPECT_NEAR(got.low, 8.092779115512402, 1e-12);
  EXPECT_NEAR(got.high, 17.39802450158856, 1e-12);
  const Yarn want = reference_yarn(64, 150000, 32, 4096, 1, 32);
  for (int j = 0; j < 32; ++j) EXPECT_NEAR(got.inv_freq[j], want.inv_freq[j], 1e-15) << j;
}

TEST(Yarn, NoScalingIsPlainRope) {
  RopeParams p = tiny_rope();
  p.scaling_factor = 1.0;
  p.head_dim = 4;  // the low/high band is not checked without scaling
  const YarnFrequencies got = yarn_frequencies(p);
  EXPECT_EQ(got.concentration, 1.0);
  // 1 / pow against pow: two roundings and pow's own error on each side, within 8 ulps.
  const double want = std::pow(150000.0, -0.5);
  EXPECT_NEAR(got.inv_freq[1], want, 8 * std::ldexp(want, -52));
}

TEST(Yarn, LowHighConditionGivesClearError) {
  RopeParams p = tiny_rope();
  p.head_dim = 4;  // d/2 - 1 = 1 < high ≈ 1.09
  try {
    yarn_frequencies(p);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("0 < low < high < head_dim/2 - 1"), std::string::npos) << msg;
  }
  p = tiny_rope();
  p.initial_context_length = 64;  // ln(64 / (32 · 2π)) < 0: low < 0
  EXPECT_THROW(yarn_frequencies(p), Error);
  p = tiny_rope();
  p.head_dim = 15;
  EXPECT_THROW(yarn_frequencies(p), Error);
  p = tiny_rope();
  p.theta = 1.0;
  EXPECT_THROW(yarn_frequencies(p), Error);
}

TEST(Rope, UnitVectorsRotateByConcentratedCosSin) {
  const RopeParams p = tiny_rope();
  const Yarn y = reference_yarn(16, 150000, 32, 4096, 1, 32);
  const int T = 5;
  const int d = 16;
  // Head h of token t is the unit vector e_h (h < 16); 16 heads cover every coordinate.
  Tensor x(Shape{T, d, d}, DType::f64);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < d; ++h) x.span<double>()[(t * d + h) * d + h] = 1.0;
  }
  auto [q, k] = rope(x, x, p, /*position_offset=*/3);
  ASSERT_TRUE(q.bitwise_equal(k));
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < d / 2; ++j) {
      const double angle = (t + 3) * y.inv_freq[j];
      const double c = std::cos(angle) * y.concentration;
      const double s = std::sin(angle) * y.concentration;
      const auto at = [&](int h, int i) { return q.item((t * d + h) * d + i); };
      // e_j (first half) -> c e_j + s e_{j+8};  e_{j+8} -> -s e_j + c e_{j+8}. The same
      // std::cos and std::sin, then one product: 1e-14 is 45 ulps of |c|, |s| <= 1.35.
      EXPECT_NEAR(at(j, j), c, 1e-14);
      EXPECT_NEAR(at(j, j + 8), s, 1e-14);
      EXPECT_NEAR(at(j + 8, j), -s, 1e-14);
      EXPECT_NEAR(at(j + 8, j + 8), c, 1e-14);
      EXPECT_EQ(at(j, (j + 1) % 8), 0.0);
    }
  }
}

TEST(Rope, OffsetTableIsASliceOfTheFullTable) {
  const RopeParams p = tiny_rope();
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    const RopeTable full = rope_table(p, 10, 0, dt);
    const RopeTable part = rope_table(p, 4, 6, dt);
    EXPECT_EQ(full.cos.dtype(), dt);
    EXPECT_TRUE(part.cos.bitwise_equal(full.cos.slice(0, 6, 4))) << dtype_name(dt);
    EXPECT_TRUE(part.sin.bitwise_equal(full.sin.slice(0, 6, 4))) << dtype_name(dt);
  }
}

TEST(Rope, GqaViewEqualsFlatHeadsAndBf16FollowsF32) {
  const RopeParams p = tiny_rope();
  const Tensor q = random_normal(Shape{6, 2, 3, 16}, DType::f32, {.seed = 6, .stream = 0});
  const RopeTable table = rope_table(p, 6, 0, DType::f32);
  const Tensor a = apply_rope(q, table);
  const Tensor b = apply_rope(q.reshape(Shape{6, 6, 16}), table);
  EXPECT_TRUE(a.reshape(Shape{6, 6, 16}).bitwise_equal(b));
  const Tensor qb = q.astype(DType::bf16);
  const Tensor ab = apply_rope(qb, rope_table(p, 6, 0, DType::bf16));
  ASSERT_EQ(ab.dtype(), DType::bf16);
  // Element i is x_i c ∓ x_partner s. In bf16 each product's input, table entry and product
  // round to bf16 (2^-8 relative each) and the result once more: |err| <= 2^-8 (3 m + |a|),
  // m = |x_i c| + |x_partner s|; 4 m covers the second-order terms and the f32 result's error.
  const std::int64_t half = 8;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const std::int64_t t = i / (6 * 2 * half), col = i % (2 * half), j = col % half;
    const std::int64_t partner = col < half ? i + half : i - half;
    const double m = std::abs(q.item(i) * table.cos.item(t * half + j)) +
                     std::abs(q.item(partner) * table.sin.item(t * half + j));
    EXPECT_NEAR(ab.item(i), a.item(i), std::ldexp(4 * m + std::abs(a.item(i)), -8)) << i;
  }
}

TEST(Rope, BadInputThrows) {
  const RopeParams p = tiny_rope();
  const RopeTable table = rope_table(p, 4, 0, DType::f32);
  EXPECT_THROW(apply_rope(Tensor(Shape{5, 2, 16}, DType::f32), table), Error);  // T
  EXPECT_THROW(apply_rope(Tensor(Shape{4, 2, 8}, DType::f32), table), Error);   // head_dim
  EXPECT_THROW(apply_rope(Tensor(Shape{4, 2, 16}, DType::f64), table), Error);  // dtype
  EXPECT_THROW(rope(Tensor(Shape{4, 16}, DType::f32), Tensor(Shape{3, 16}, DType::f32), p), Error);
  EXPECT_THROW(rope_table(p, 4, -1, DType::f32), Error);
  EXPECT_THROW(rope_table(p, 4, 0, DType::i32), Error);
}

}  // namespace test_ops_rope
}  // namespace meshtest
