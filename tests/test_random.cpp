// Philox-4x32-10 known answers, determinism, shard == slice, and distribution checks.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "src/core/random.hpp"

namespace meshtest {
namespace test_random {

using Words4 = std::array<std::uint32_t, 4>;

// Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter, key -> output.
TEST(Philox, Random123KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (Words4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(
      philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
      (Words4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(
      philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
      (Words4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, ElementCounterAndKeyLayout) {
  // Element 0 of seed 0, stream 0 is the all-zero KAT block.
  EXPECT_EQ(random_bits_at({}, 0), (Words4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  // Element 2^64-1 of stream 2^64-1 under seed 2^64-1 is the all-ones KAT block.
  const std::uint64_t ones = ~std::uint64_t{0};
  EXPECT_EQ(random_bits_at({.seed = ones, .stream = ones}, ones),
            (Words4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  // uniform_at takes the top 53 bits of w1:w0.
  const std::uint64_t x = (std::uint64_t{0xe169c58d} << 32) | 0x6627e8d5;
  EXPECT_EQ(uniform_at({}, 0), std::ldexp(static_cast<double>(x >> 11), -53));
}

TEST(Random, DeterministicAndKeyed) {
  const Shape s{7, 5};
  for (DType t : {DType::f32, DType::f64, DType::bf16}) {
    const Tensor a = random_normal(s, t, {.seed = 42});
    EXPECT_TRUE(a.bitwise_equal(random_normal(s, t, {.seed = 42}))) << dtype_name(t);
    EXPECT_FALSE(a.bitwise_equal(random_normal(s, t, {.seed = 43}))) << dtype_name(t);
    EXPECT_FALSE(a.bitwise_equal(random_normal(s, t, {.seed = 42, .stream = 1}))) << dtype_name(t);
  }
  // Element i depends only on (key, i): a prefix of a bigger tensor is the smaller tensor.
  const Tensor small = random_uniform(Shape{10}, DType::f64, {.seed = 3});
  const Tensor big = random_uniform(Shape{100}, DType::f64, {.seed = 3});
  EXPECT_TRUE(big.slice(0, 0, 10).bitwise_equal(small));
  for (std::int64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(small.item(i), uniform_at({.seed = 3}, static_cast<std::uint64_t>(i)));
  }
  const Tensor n = random_normal(Shape{4}, DType::f64, {.seed = 5, .stream = 9}, 2.0, 3.0);
  for (std::int64_t i = 0; i < 4; ++i) {
    // mean + std * z: -march=native may fuse one side into an FMA and not the other (4 ulps).
    EXPECT_DOUBLE_EQ(
        n.item(i), 2.0 + 3.0 * normal_at({.seed = 5, .stream = 9}, static_cast<std::uint64_t>(i)));
  }
}

TEST(Random, NarrowFloatsRoundFromDouble) {
  const Shape s{33, 3};
  const Tensor wide = random_normal(s, DType::f64, {.seed = 8});
  EXPECT_TRUE(random_normal(s, DType::f32, {.seed = 8}).bitwise_equal(wide.astype(DType::f32)));
  EXPECT_TRUE(random_normal(s, DType::bf16, {.seed = 8}).bitwise_equal(wide.astype(DType::bf16)));
  EXPECT_TRUE(random_normal(s, DType::f16, {.seed = 8}).bitwise_equal(wide.astype(DType::f16)));
}

TEST(Random, ShardEqualsSliceOfWholeForEveryDimAndDtype) {
  const RandomKey key{.seed = 1234, .stream = 77};
  const std::vector<Shape> shapes = {Shape{13}, Shape{5, 7}, Shape{3, 4, 5}, Shape{2, 3, 1, 5},
                                     Shape{4, 0, 3}};
  const std::vector<Distribution> dists = {Normal{0.5, 2.0}, Uniform{-1.0, 3.0}, Integers{-3, 100}};
  for (const Shape& s : shapes) {
    for (DType t : kAllDTypes) {
      for (const Distribution& dist : dists) {
        if (!is_floating(t) && !std::holds_alternative<Integers>(dist)) continue;
        const Distribution d =
            t == DType::u8 ? Distribution{Integers{0, 255}} : dist;  // u8 holds 0..255 only
        const Tensor whole = generate(s, t, key, d);
        for (int dim = 0; dim < s.rank(); ++dim) {
          for (int p : {1, 2, 3, 4}) {
            for (int i = 0; i < p; ++i) {
              const Range r = split_range(s[dim], p, i);
              const Tensor shard = generate_slice(s, dim, r, t, key, d);
              EXPECT_TRUE(shard.bitwise_equal(whole.slice(dim, r)))
                  << "shape " << s.str() << " dtype " << dtype_name(t) << " dist " << d.index()
                  << " dim " << dim << " part " << i << "/" << p;
            }
          }
          // Negative dims address the same dim.
          const Range r = s[dim] > 0 ? Range{1, s[dim] - 1} : Range{0, 0};
          EXPECT_TRUE(
              generate_slice(s, dim - s.rank(), r, t, key, d).bitwise_equal(whole.slice(dim, r)));
        }
      }
    }
  }
}

TEST(Random, NormalMomentsWithinStandardErrors) {
  constexpr std::int64_t n = 100000;
  const Tensor t = random_normal(Shape{n}, DType::f64, {.seed = 2024});
  const auto v = t.vector<double>();
  const double mean = v.mean();
  const double var = (v.array() - mean).square().sum() / (n - 1);
  // se(mean) = 1/sqrt(n) ~ 0.0032; se(var) = sqrt(2/n) ~ 0.0045. Allow 5 standard errors.
  EXPECT_LT(std::abs(mean), 5.0 / std::sqrt(double{n})) << "mean " << mean;
  EXPECT_LT(std::abs(var - 1.0), 5.0 * std::sqrt(2.0 / n)) << "var " << var;
  EXPECT_TRUE(v.allFinite());
  // About 31.7% of N(0,1) lies outside +-1 (se ~ 0.0015).
  const double outside = static_cast<double>((v.array().abs() > 1.0).count()) / n;
  EXPECT_NEAR(outside, 0.3173, 0.0075);
}

TEST(Random, UniformInRangeAndSpread) {
  constexpr std::int64_t n = 20000;
  const Tensor t = random_uniform(Shape{n}, DType::f64, {.seed = 1}, -2.0, 3.0);
  const auto v = t.vector<double>();
  EXPECT_GE(v.minCoeff(), -2.0);
  EXPECT_LT(v.maxCoeff(), 3.0);
  EXPECT_NEAR(v.mean(), 0.5, 5.0 * 5.0 / std::sqrt(12.0 * n));
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {  // rounding may reach hi, never beyond
    const Tensor r = random_uniform(Shape{n}, d, {.seed = 1}, -2.0, 3.0).astype(DType::f64);
    EXPECT_GE(r.vector<double>().minCoeff(), -2.0) << dtype_name(d);
    EXPECT_LE(r.vector<double>().maxCoeff(), 3.0) << dtype_name(d);
  }
}

TEST(Random, IntegersCoverInclusiveRangeInEveryDtype) {
  for (DType t : kAllDTypes) {
    const std::int64_t lo = t == DType::u8 ? 250 : -3, hi = t == DType::u8 ? 255 : 4;
    const Tensor x = random_integers(Shape{2000}, t, {.seed = 6}, lo, hi);
    std::set<std::int64_t> seen;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const double v = x.item(i);
      ASSERT_EQ(v, std::floor(v)) << dtype_name(t);
      ASSERT_GE(v, static_cast<double>(lo)) << dtype_name(t);
      ASSERT_LE(v, static_cast<double>(hi)) << dtype_name(t);
      seen.insert(static_cast<std::int64_t>(v));
    }
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(hi - lo + 1)) << dtype_name(t);
  }
  // A single-value range and the full int64 range.
  EXPECT_EQ(random_integers(Shape{5}, DType::i64, {}, 7, 7).vector<std::int64_t>().minCoeff(), 7);
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  const Tensor full = random_integers(Shape{64}, DType::i64, {}, -big - 1, big);
  EXPECT_LT(full.vector<std::int64_t>().minCoeff(), 0);
  EXPECT_GT(full.vector<std::int64_t>().maxCoeff(), 0);
}

TEST(Random, BadInputThrows) {
  const RandomKey k{};
  EXPECT_THROW(random_normal(Shape{3}, DType::i32, k), Error);
  EXPECT_THROW(random_uniform(Shape{3}, DType::u8, k), Error);
  EXPECT_THROW(random_normal(Shape{3}, DType::f32, k, 0.0, -1.0), Error);
  EXPECT_THROW(random_normal(Shape{3}, DType::f32, k, NAN, 1.0), Error);
  EXPECT_THROW(random_uniform(Shape{3}, DType::f32, k, 2.0, 1.0), Error);
  EXPECT_THROW(random_uniform(Shape{3}, DType::f32, k, 0.0, INFINITY), Error);
  EXPECT_THROW(random_integers(Shape{3}, DType::i32, k, 2, 1), Error);
  EXPECT_THROW(random_integers(Shape{3}, DType::u8, k, -1, 3), Error);
  EXPECT_THROW(random_integers(Shape{3}, DType::u8, k, 0, 256), Error);
  EXPECT_THROW(random_integers(Shape{3}, DType::bf16, k, 0, 257), Error);
  EXPECT_THROW(random_integers(Shape{3}, DType::f16, k, -2049, 0), Error);
  EXPECT_NO_THROW(random_integers(Shape{3}, DType::f16, k, -2048, 2048));
  EXPECT_THROW(random_integers(Shape{3}, DType::f32, k, 0, (1 << 24) + 1), Error);
  EXPECT_THROW(random_integers(Shape{3}, DType::i32, k, 0, std::int64_t{1} << 31), Error);
  EXPECT_THROW(random_integers(Shape{3}, DType::i32, k, -(std::int64_t{1} << 31) - 1, 0), Error);
  EXPECT_THROW(integer_at(k, 0, 1, 0), Error);
  EXPECT_THROW(generate_slice(Shape{4, 5}, 2, {0, 1}, DType::f32, k, Normal{}), Error);
  EXPECT_THROW(generate_slice(Shape{4, 5}, 1, {3, 3}, DType::f32, k, Normal{}), Error);
  EXPECT_THROW(generate_slice(Shape{4, 5}, 1, {-1, 1}, DType::f32, k, Normal{}), Error);
  EXPECT_THROW(generate_slice(Shape{}, 0, {0, 0}, DType::f32, k, Normal{}), Error);
}

TEST(Random, RankZeroAndEmpty) {
  const Tensor s = random_normal(Shape{}, DType::f64, {.seed = 9});
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item(0), normal_at({.seed = 9}, 0));
  EXPECT_EQ(random_normal(Shape{0, 3}, DType::f32, {}).numel(), 0);
}

}  // namespace test_random
}  // namespace meshtest
