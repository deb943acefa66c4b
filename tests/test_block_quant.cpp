// fp8 block quantization against references of its own: each block's scale against its amax
// found by a separate pass over the elements, the error of every element against the format's
// half-step bound, crafted blocks that quantize exactly, ragged edge blocks, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "src/ops/block_quant.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_block_quant {

/// rows x cols values, each block of br x bc scaled by its own power of ten, so that scales
/// differ per block.
Tensor varied(std::int64_t rows, std::int64_t cols, std::int64_t br, std::int64_t bc) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const auto k = static_cast<int>((r / br * 5 + c / bc * 3) % 7) - 3;
      v[static_cast<std::size_t>(r * cols + c)] =
          normal(gen) * std::pow(10.0f, static_cast<float>(k));
    }
  }
  return Tensor::from_vector<float>(Shape({rows, cols}), v);
}

/// max |x| of each block, keyed by (block row, block col), from one pass over the elements.
std::map<std::pair<std::int64_t, std::int64_t>, float> block_amax(const Tensor& x, std::int64_t br,
                                                                  std::int64_t bc) {
  std::map<std::pair<std::int64_t, std::int64_t>, float> m;
  const std::int64_t cols = x.shape()[1];
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    float& a = m[{i / cols / br, i % cols / bc}];
    a = std::max(a, std::fabs(x.data<float>()[i]));
  }
  return m;
}

/// Every dequantized element is within half a step of the format of x (relative, in the
/// normal range) or half the smallest subnormal times its block's scale.
void expect_within_half_step(const Tensor& x, const BlockQuantized& q) {
  const Tensor dq = dequantize(q);
  const int mantissa = q.format == Fp8Format::e4m3fn ? 3 : 2;
  const double half_subnormal =
      q.format == Fp8Format::e4m3fn ? std::ldexp(1.0, -10) : std::ldexp(1.0, -17);
  const std::int64_t cols = x.shape()[1];
  const std::int64_t nbc = q.scales.shape()[1];
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data<float>()[i], d = dq.data<float>()[i];
    const double scale =
        q.scales.data<float>()[(i / cols / q.block_rows) * nbc + i % cols / q.block_cols];
    // (1 + 1e-6): the f32 roundings of x / scale and code * scale (2^-23 |v| together), on any
    // processor a single correctly rounded operation each.
    const double bound =
        std::ldexp(std::fabs(v), -(mantissa + 1)) * (1 + 1e-6) + half_subnormal * scale;
    ASSERT_LE(std::fabs(d - v), bound) << "element " << i << ": " << v << " -> " << d;
  }
}

class BlockQuant : public ::testing::TestWithParam<Fp8Format> {};

TEST_P(BlockQuant, RaggedBlocksGetTheirAmaxOverTheFormatMaxAsScale) {
  // 300 x 200 in 128 x 128 blocks: 3 x 2 blocks, the last row and column of them ragged.
  const Tensor w = varied(300, 200, 128, 128);
  const BlockQuantized q = quantize_blocks(w, 128, GetParam());
  ASSERT_EQ(q.scales.shape(), Shape({3, 2}));
  ASSERT_EQ(q.codes.shape(), Shape({300, 200}));
  for (const auto& [block, amax] : block_amax(w, 128, 128)) {
    EXPECT_EQ(q.scales.data<float>()[block.first * 2 + block.second], amax / fp8_max(GetParam()))
        << "block " << block.first << ", " << block.second;
  }
  expect_within_half_step(w, q);
}

TEST_P(BlockQuant, LargerBlocksAndNonAlignedShapes) {
  for (const auto& [rows, cols, b] :
       {std::tuple{1536, 256, 256}, std::tuple{520, 1030, 512}, std::tuple{17, 33, 16}}) {
    const Tensor w = varied(rows, cols, b, b);
    const BlockQuantized q = quantize_blocks(w, b, GetParam());
    EXPECT_EQ(q.scales.shape(), Shape({(rows + b - 1) / b, (cols + b - 1) / b}));
    expect_within_half_step(w, q);
  }
}

TEST_P(BlockQuant, GroupsAlongEachRow) {
  const Tensor x = varied(5, 300, 1, 128);
  const BlockQuantized q = quantize_groups(x, 128, GetParam());
  ASSERT_EQ(q.scales.shape(), Shape({5, 3}));
  EXPECT_EQ(q.block_rows, 1);
  for (const auto& [group, amax] : block_amax(x, 1, 128)) {
    EXPECT_EQ(q.scales.data<float>()[group.first * 3 + group.second], amax / fp8_max(GetParam()));
  }
  expect_within_half_step(x, q);
}

TEST_P(BlockQuant, ABlockOfRepresentableValuesTimesAPowerOfTwoIsExact) {
  // Every finite code's value times 2^-5, the largest magnitude first so the scale is 2^-5.
  const Fp8Format f = GetParam();
  std::vector<float> v;
  v.push_back(fp8_max(f) * 0x1p-5f);
  for (int c = 0; c < 256; ++c) {
    const float d = fp8_decode(static_cast<std::uint8_t>(c), f);
    if (std::isfinite(d) && v.size() < 16 * 16) v.push_back(d * 0x1p-5f);
  }
  v.resize(16 * 16, 0.0f);
  const Tensor w = Tensor::from_vector<float>(Shape({16, 16}), v);
  const BlockQuantized q = quantize_blocks(w, 16, f);
  EXPECT_EQ(q.scales.data<float>()[0], 0x1p-5f);
  EXPECT_TRUE(dequantize(q).bitwise_equal(w));
}

TEST_P(BlockQuant, AnAllZeroBlockHasScaleOneAndZeroCodes) {
  const Tensor w(Shape({32, 48}), DType::f32);
  const BlockQuantized q = quantize_blocks(w, 16, GetParam());
  for (float s : q.scales.span<float>()) EXPECT_EQ(s, 1.0f);
  for (std::uint8_t c : q.codes.span<std::uint8_t>()) EXPECT_EQ(c, 0);
  EXPECT_TRUE(dequantize(q).bitwise_equal(w));
}

INSTANTIATE_TEST_SUITE_P(Formats, BlockQuant, ::testing::ValuesIn(kFp8Formats),
                         [](const auto& info) { return std::string(fp8_name(info.param)); });

TEST(BlockQuantErrors, BadBlocksShapesAndValues) {
  const Tensor w = varied(32, 32, 16, 16);
  for (std::int64_t b : {0, -16, 100, 8}) {
    test_support::expect_error(
        [&] { quantize_blocks(w, b); },
        {"block " + std::to_string(b) + " is not a positive multiple of 16"});
  }
  test_support::expect_error([&] { quantize_groups(w, 24); },
                             {"group 24 is not a positive multiple of 16"});
  std::vector<float> v(32 * 32, 1.0f);
  v[3 * 32 + 7] = std::numeric_limits<float>::quiet_NaN();
  test_support::expect_error(
      [&] {
        quantize_blocks(Tensor::from_vector<float>(Shape({32, 32}), v), 16);
      },
      {"weight [32, 32] is nan at row 3, column 7", "only finite values"});
  v[3 * 32 + 7] = 1.0f;
  v[31 * 32 + 31] = -INFINITY;
  test_support::expect_error(
      [&] {
        quantize_groups(Tensor::from_vector<float>(Shape({32, 32}), v), 16);
      },
      {"activations [32, 32] is -inf at row 31, column 31"});
  test_support::expect_error(
      [&] {
        quantize_blocks(Tensor(Shape({2, 16, 16}), DType::f32), 16);
      },
      {"must be 2-D"});
  test_support::expect_error(
      [&] {
        quantize_blocks(Tensor(Shape({16, 16}), DType::i32), 16);
      },
      {"must be f32, f64 or bf16"});
  BlockQuantized q = quantize_blocks(w, 16);
  q.scales = Tensor(Shape({2, 3}), DType::f32);
  test_support::expect_error([&] { dequantize(q); },
                             {"codes [32, 32] in 16 x 16 blocks need f32 scales [2, 2]"});
}

}  // namespace test_block_quant
}  // namespace meshtest
