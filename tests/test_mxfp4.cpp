// MXFP4: every code at several scales, nibble order, block boundaries, bad shapes, encode.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "src/core/random.hpp"
#include "src/ops/mxfp4.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_mxfp4 {

using test_support::expect_error;

// The e2m1 table written out by hand (codes 0..15), independent of the code under test.
constexpr double kTable[16] = {0.0,  0.5,  1.0,  1.5,  2.0,  3.0,  4.0,  6.0,
                               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};

Tensor u8_tensor(Shape shape, const std::vector<std::uint8_t>& v) {
  return Tensor::from_vector(shape, v);
}

// One block holding codes 0..15 twice: byte i = code (2i mod 16) | code (2i+1 mod 16) << 4.
Tensor all_codes_block() {
  std::vector<std::uint8_t> b(16);
  for (int i = 0; i < 16; ++i)
    b[i] = static_cast<std::uint8_t>(((2 * i) % 16) | (((2 * i + 1) % 16) << 4));
  return u8_tensor({1, 16}, b);
}

TEST(Mxfp4, EveryCodeAtSeveralScales) {
  // 2^(s - 127) for s = 127, 128, 126, 120, 130.
  const std::vector<std::pair<std::uint8_t, double>> scales = {
      {127, 1.0}, {128, 2.0}, {126, 0.5}, {120, 1.0 / 128}, {130, 8.0}};
  for (const auto& [s, factor] : scales) {
    for (const DType out : {DType::f32, DType::f64, DType::bf16}) {
      const Tensor d = mxfp4_decode(all_codes_block(), u8_tensor({1}, {s}), out);
      ASSERT_EQ(d.shape(), (Shape{32})) << "scale " << int(s);
      for (int i = 0; i < 32; ++i) {
        const double want = kTable[i % 16] * factor;
        EXPECT_EQ(d.item(i), want)
            << "scale " << int(s) << " element " << i << " " << dtype_name(out);
        EXPECT_EQ(std::signbit(d.item(i)), std::signbit(want)) << "element " << i;
      }
    }
  }
}

TEST(Mxfp4, LowNibbleFirst) {
  std::vector<std::uint8_t> b(16, 0);
  b[0] = 0x71;   // element 0: code 1 (0.5), element 1: code 7 (6)
  b[15] = 0x9E;  // element 30: code 14 (-4), element 31: code 9 (-0.5)
  const Tensor d = mxfp4_decode(u8_tensor({1, 16}, b), u8_tensor({1}, {127}), DType::f32);
  EXPECT_EQ(d.item(0), 0.5);
  EXPECT_EQ(d.item(1), 6.0);
  EXPECT_EQ(d.item(30), -4.0);
  EXPECT_EQ(d.item(31), -0.5);
  for (int i = 2; i < 30; ++i) EXPECT_EQ(d.item(i), 0.0);
}

TEST(Mxfp4, BlockBoundariesUseTheirOwnScale) {
  // [2 rows, 3 blocks, 16]: every byte 0x22 (1.0, 1.0); scales differ per block.
  const std::vector<std::uint8_t> s = {127, 128, 129, 126, 125, 124};
  const Tensor d = mxfp4_decode(u8_tensor({2, 3, 16}, std::vector<std::uint8_t>(96, 0x22)),
                                u8_tensor({2, 3}, s), DType::f64);
  ASSERT_EQ(d.shape(), (Shape{2, 96}));
  for (int r = 0; r < 2; ++r) {
    for (int g = 0; g < 3; ++g) {
      const double want = std::ldexp(1.0, s[r * 3 + g] - 127);
      for (int i = 0; i < 32; ++i) EXPECT_EQ(d.item(r * 96 + g * 32 + i), want);
    }
  }
  // A slice of rows decodes like decode-then-slice.
  const Tensor rows =
      mxfp4_decode(u8_tensor({2, 3, 16}, std::vector<std::uint8_t>(96, 0x22)).slice(0, 1, 1),
                   u8_tensor({2, 3}, s).slice(0, 1, 1), DType::f64);
  EXPECT_TRUE(rows.bitwise_equal(d.slice(0, 1, 1)));
}

TEST(Mxfp4, BadShapesAndDtypes) {
  const Tensor b = u8_tensor({2, 16}, std::vector<std::uint8_t>(32, 0));
  expect_error(
      [&] {
        mxfp4_decode(u8_tensor({2, 8}, std::vector<std::uint8_t>(16, 0)),
                     u8_tensor({2}, {127, 127}));
      },
      {"[2, 8]", "16"});
  expect_error([&] { mxfp4_decode(b, u8_tensor({3}, {1, 2, 3})); }, {"[3]", "[2, 16]", "[2]"});
  expect_error([&] { mxfp4_decode(b.astype(DType::f32), u8_tensor({2}, {1, 2})); }, {"u8"});
  expect_error([&] { mxfp4_decode(b, u8_tensor({2}, {1, 2}), DType::i32); }, {"i32"});
  expect_error([] { mxfp4_encode(Tensor({2, 31}, DType::f32)); }, {"[2, 31]", "32"});
  expect_error([] { mxfp4_encode(Tensor({32}, DType::i32)); }, {"i32"});
  Tensor inf({32}, DType::f32);
  inf.data<float>()[3] = INFINITY;
  expect_error([&] { mxfp4_encode(inf); }, {"element 3", "finite"});
}

TEST(Mxfp4, DecodedShapeThatOverflowsIsAnError) {
  // A header may claim [0, 2^58, 16] (0 bytes): 2^58 blocks of 32 values is 2^63.
  expect_error(
      [] {
        mxfp4_decoded_shape(Shape{0, std::int64_t{1} << 58, 16});
      },
      {"[0, 288230376151711744, 16]", "beyond int64"});
  EXPECT_EQ(mxfp4_decoded_shape(Shape{0, std::int64_t{1} << 57, 16}),
            (Shape{0, std::int64_t{1} << 62}));
}

TEST(Mxfp4, EncodeDecodeRoundTripsOnTheGrid) {
  // Random codes with each block's max |code value| 4 or 6: the encoding is canonical.
  const Tensor codes = random_integers({3, 4, 32}, DType::i64, {.seed = 7}, 0, 15);
  const Tensor sc = random_integers({3, 4}, DType::i64, {.seed = 8}, 100, 150);
  std::vector<std::uint8_t> b(3 * 4 * 16), s(12);
  for (int g = 0; g < 12; ++g) {
    s[g] = static_cast<std::uint8_t>(sc.item(g));
    for (int i = 0; i < 32; ++i) {
      auto code = static_cast<std::uint8_t>(codes.item(g * 32 + i));
      if (i == g % 32) code = g % 2 == 0 ? 7 : 14;  // forces max |value| 6 or 4
      b[g * 16 + i / 2] |= static_cast<std::uint8_t>(i % 2 == 0 ? code : code << 4);
    }
  }
  const Tensor blocks = u8_tensor({3, 4, 16}, b), scales = u8_tensor({3, 4}, s);
  for (const DType dt : {DType::f32, DType::f64, DType::bf16}) {
    const Mxfp4 m = mxfp4_encode(mxfp4_decode(blocks, scales, dt));
    EXPECT_TRUE(m.blocks.bitwise_equal(blocks)) << dtype_name(dt);
    EXPECT_TRUE(m.scales.bitwise_equal(scales)) << dtype_name(dt);
  }
  // Any decodable values (smaller maxima too) survive decode(encode(.)) exactly.
  const Tensor small = random_integers({2, 4, 16}, DType::u8, {.seed = 9}, 0, 0x55);
  const Tensor v =
      mxfp4_decode(small, u8_tensor({2, 4}, {127, 0, 3, 250, 90, 127, 140, 1}), DType::f32);
  EXPECT_TRUE(mxfp4_decode(mxfp4_encode(v), DType::f32).bitwise_equal(v));
  // An all-zero block gets scale 127.
  EXPECT_EQ(mxfp4_encode(Tensor({32}, DType::f32)).scales.item(0), 127.0);
}

TEST(Mxfp4, EncodeErrorIsAtMostHalfAGridStep) {
  const Tensor w = random_normal({8, 64}, DType::f32, {.seed = 3}, 0.0, 2.0);
  const Mxfp4 m = mxfp4_encode(w);
  const Tensor q = mxfp4_decode(m, DType::f64);
  const double grid[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  for (std::int64_t i = 0; i < w.numel(); ++i) {
    const double scale = std::ldexp(1.0, static_cast<int>(m.scales.item(i / 32)) - 127);
    const double v = std::abs(w.item(i)) / scale;
    ASSERT_LE(v, 6.0) << "element " << i;  // the scale covers the block's max
    int k = 0;
    while (k < 6 && v > grid[k + 1]) ++k;
    const double half_step = 0.5 * (grid[k + 1] - grid[k]) * scale;
    EXPECT_LE(std::abs(q.item(i) - w.item(i)), half_step) << "element " << i;
  }
  // The block max lands in (3, 6] * scale: the smallest scale that covers it.
  for (std::int64_t g = 0; g < m.scales.numel(); ++g) {
    double mx = 0;
    for (int i = 0; i < 32; ++i) mx = std::max(mx, std::abs(w.item(g * 32 + i)));
    const double scale = std::ldexp(1.0, static_cast<int>(m.scales.item(g)) - 127);
    EXPECT_GT(mx / scale, 3.0);
    EXPECT_LE(mx / scale, 6.0);
  }
}

TEST(Mxfp4, TiesRoundToEvenCodes) {
  // One block, scale 2^0 (max 6): 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
  // 3.5 -> 4, 5 -> 4, and -2.5 -> -2.
  std::vector<float> x(32, 0.0f);
  const std::vector<float> in = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -2.5f, 6.0f};
  const std::vector<double> want = {0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -2.0, 6.0};
  std::copy(in.begin(), in.end(), x.begin());
  const Tensor q = mxfp4_decode(mxfp4_encode(Tensor::from_vector({32}, x)), DType::f64);
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(q.item(i), want[i]) << "input " << in[i];
}

}  // namespace test_mxfp4
}  // namespace meshtest
