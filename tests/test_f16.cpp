// f16 (src/core/f16.hpp, f16_bits.hpp): binary16 to and from f32, f64, bf16 and integers against
// closed forms and crafted exact values; every rounding boundary of every f16 against the
// midpoint rule; all 65536 bit patterns widened and narrowed back.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "src/core/dtype.hpp"
#include "src/core/f16.hpp"

namespace meshtest {
namespace test_f16 {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::uint16_t from_f32(float x) { return f16(x).bits; }
std::uint16_t from_f64(double x) { return f16(x).bits; }
float to_f32(std::uint16_t h) { return static_cast<float>(f16::from_bits(h)); }
bool is_nan_bits(std::uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }

/// The value of a finite or infinite pattern from its fields: (-1)^s 2^(e-15) (1 + f/1024), or
/// (-1)^s 2^-24 f for e = 0.
double closed_form(std::uint16_t h) {
  const int e = (h >> 10) & 0x1f, f = h & 0x3ff;
  const double sign = (h & 0x8000) != 0 ? -1.0 : 1.0;
  if (e == 0x1f) return sign * kInf;
  if (e == 0) return sign * std::ldexp(f, -24);
  return sign * std::ldexp(1024 + f, e - 25);
}

TEST(F16, ClosedFormsBothWays) {
  struct Case {
    double value;
    std::uint16_t bits;
  };
  const Case cases[] = {
      {1.0, 0x3c00},
      {-2.0, 0xc000},
      {0.5, 0x3800},
      {65504.0, 0x7bff},                     // the largest finite
      {std::ldexp(1.0, -14), 0x0400},        // the least normal
      {std::ldexp(1.0, -24), 0x0001},        // the least subnormal
      {std::ldexp(1023.0, -24), 0x03ff},     // the largest subnormal
      {1.0 + std::ldexp(1.0, -10), 0x3c01},  // 1 + ulp
      {0.0, 0x0000},
      {-0.0, 0x8000},
      {kInf, 0x7c00},
      {-kInf, 0xfc00},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.value);
    EXPECT_EQ(from_f64(c.value), c.bits);
    EXPECT_EQ(from_f32(static_cast<float>(c.value)), c.bits);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(to_f32(c.bits)),
              std::bit_cast<std::uint32_t>(static_cast<float>(c.value)));
    EXPECT_EQ(std::bit_cast<std::uint64_t>(static_cast<double>(f16::from_bits(c.bits))),
              std::bit_cast<std::uint64_t>(c.value));
  }
}

TEST(F16, HalfwayCasesRoundToEven) {
  const double u = std::ldexp(1.0, -10);                          // the ulp of [1, 2)
  EXPECT_EQ(from_f64(1 + u / 2), 0x3c00);                         // tie: down to the even 1
  EXPECT_EQ(from_f64(1 + 3 * u / 2), 0x3c02);                     // tie: up to the even 1 + 2u
  EXPECT_EQ(from_f64(1 + u / 2 + std::ldexp(1.0, -40)), 0x3c01);  // just past the tie
  EXPECT_EQ(from_f64(1 + u / 2 - std::ldexp(1.0, -40)), 0x3c00);  // just short of it
  EXPECT_EQ(from_f32(1 + 0x1p-11f), 0x3c00);
  EXPECT_EQ(from_f32(1 + 0x1p-11f + 0x1p-23f), 0x3c01);
  EXPECT_EQ(from_f64(2049.0), 0x6800);  // 2048: above 2048 the ulp is 2
  EXPECT_EQ(from_f64(2051.0), 0x6802);  // 2052
  // Subnormals, whose unit is 2^-24.
  EXPECT_EQ(from_f64(std::ldexp(1.0, -25)), 0x0000);  // half the least: to the even 0
  EXPECT_EQ(from_f64(std::ldexp(3.0, -25)), 0x0002);  // 1.5 units: to 2
  EXPECT_EQ(from_f64(std::ldexp(5.0, -25)), 0x0002);  // 2.5 units: to 2
  EXPECT_EQ(from_f64(std::ldexp(1.0, -25) * (1 + 0x1p-30)), 0x0001);
  EXPECT_EQ(from_f64(std::ldexp(1.0, -26)), 0x0000);
  EXPECT_EQ(from_f64(-std::ldexp(1.0, -25)), 0x8000);    // the sign stays
  EXPECT_EQ(from_f64(std::ldexp(2047.0, -25)), 0x0400);  // 1023.5 units: to the least normal
  EXPECT_EQ(from_f32(std::numeric_limits<float>::denorm_min()), 0x0000);
}

TEST(F16, OverflowGivesInfinity) {
  EXPECT_EQ(from_f64(65519.0), 0x7bff);  // below the halfway 65520 to 2^16
  EXPECT_EQ(from_f64(65520.0), 0x7c00);  // the tie: 65504's fraction is odd, so up (to Inf)
  EXPECT_EQ(from_f64(-65520.0), 0xfc00);
  EXPECT_EQ(from_f64(65536.0), 0x7c00);
  EXPECT_EQ(from_f64(1e300), 0x7c00);
  EXPECT_EQ(from_f32(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(from_f32(-std::numeric_limits<float>::max()), 0xfc00);
  EXPECT_EQ(f16(std::numeric_limits<std::int64_t>::max()).bits, 0x7c00);
  EXPECT_EQ(f16(-70000).bits, 0xfc00);
}

TEST(F16, NanStaysNanWithItsSign) {
  EXPECT_EQ(from_f32(std::bit_cast<float>(0x7fc00000u)), 0x7e00);
  EXPECT_EQ(from_f32(std::bit_cast<float>(0xffc00000u)), 0xfe00);
  // The quiet bit and the payload's top 9 bits: 0x412345 >> 13 = 0x209.
  EXPECT_EQ(from_f32(std::bit_cast<float>(0x7fc12345u)), 0x7e09);
  // A signalling NaN whose payload lies below the kept bits is still a NaN, not Inf.
  EXPECT_EQ(from_f32(std::bit_cast<float>(0x7f800001u)), 0x7e00);
  EXPECT_EQ(from_f32(std::bit_cast<float>(0xff800001u)), 0xfe00);
  EXPECT_EQ(from_f64(std::bit_cast<double>(0x7ff0000000000001ull)), 0x7e00);
  EXPECT_EQ(from_f64(std::bit_cast<double>(0xfff8000000000000ull)), 0xfe00);
  EXPECT_TRUE(std::isnan(to_f32(0x7c01)));
  EXPECT_TRUE(std::signbit(to_f32(0xfe00)));
}

TEST(F16, FromF64RoundsOnceNotThroughF32) {
  // 1 + 2^-11 + 2^-30 lies above the tie between 1 and 1 + 2^-10, so it rounds up; through f32
  // it would first become the tie 1 + 2^-11 and then round to the even 1.
  const double x = 1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30);
  EXPECT_EQ(from_f64(x), 0x3c01);
  EXPECT_EQ(from_f32(static_cast<float>(x)), 0x3c00);
}

TEST(F16, OtherSourceTypes) {
  EXPECT_EQ(f16(bf16(1.5f)).bits, 0x3e00);
  EXPECT_EQ(f16(std::int32_t{-3}).bits, 0xc200);
  EXPECT_EQ(f16(std::uint8_t{255}).bits, 0x5bf8);
  EXPECT_EQ(f16(std::int64_t{2049}).bits, 0x6800);
  EXPECT_EQ(static_cast<std::int32_t>(f16::from_bits(0xc500)), -5);  // -5.0
  EXPECT_EQ(static_cast<std::int64_t>(f16::from_bits(0x3e00)), 1);   // 1.5 truncates
  EXPECT_EQ(static_cast<float>(static_cast<bf16>(f16::from_bits(0x3e00))), 1.5f);
  EXPECT_EQ(f16().bits, 0);
}

// Every f16 pair of neighbours a < b (and the last finite one with 2^16, where Inf begins):
// a value below their midpoint rounds to a, above it to b, on it to the one with an even
// fraction. With the neighbours themselves this fixes every rounding boundary of both signs.
TEST(F16, EveryRoundingBoundaryFollowsTheMidpointRule) {
  for (std::uint16_t h = 0; h < 0x7c00; ++h) {
    const auto b = static_cast<std::uint16_t>(h + 1);
    const double lo = closed_form(h);
    const double hi = b == 0x7c00 ? 65536.0 : closed_form(b);
    const double mid = (lo + hi) / 2;  // exact: 12 significant bits
    const std::uint16_t tie = (h & 1) == 0 ? h : b;
    for (double sign : {1.0, -1.0}) {
      const std::uint16_t s = sign < 0 ? 0x8000 : 0;
      SCOPED_TRACE(testing::Message()
                   << std::hex << "between 0x" << (h | s) << " and 0x" << (b | s));
      const auto below = std::nextafter(mid, 0.0), above = std::nextafter(mid, kInf);
      ASSERT_EQ(from_f64(sign * lo), h | s);
      ASSERT_EQ(from_f64(sign * below), h | s);
      ASSERT_EQ(from_f64(sign * mid), tie | s);
      ASSERT_EQ(from_f64(sign * above), b | s);
      const auto mid32 = static_cast<float>(mid), sign32 = static_cast<float>(sign);  // exact
      const float inf32 = std::numeric_limits<float>::infinity();
      ASSERT_EQ(from_f32(sign32 * std::nextafter(mid32, 0.0f)), h | s);
      ASSERT_EQ(from_f32(sign32 * mid32), tie | s);
      ASSERT_EQ(from_f32(sign32 * std::nextafter(mid32, inf32)), b | s);
    }
  }
}

// f16 -> f32 is exact (the closed form, bit for bit, NaNs as they are) and f32 -> f16 gives the
// pattern back; a signalling NaN comes back quiet (its quiet bit set, payload and sign kept).
TEST(F16, AllPatternsRoundTripThroughF32) {
  for (std::uint32_t i = 0; i < 0x10000; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float x = to_f32(h);
    SCOPED_TRACE(testing::Message() << std::hex << "0x" << i);
    if (is_nan_bits(h)) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(x),
                0x7f800000u | (static_cast<std::uint32_t>(h & 0x8000) << 16) |
                    (static_cast<std::uint32_t>(h & 0x03ff) << 13));
      ASSERT_EQ(from_f32(x), h | 0x0200);
    } else {
      ASSERT_EQ(std::bit_cast<std::uint64_t>(static_cast<double>(x)),
                std::bit_cast<std::uint64_t>(closed_form(h)));
      ASSERT_EQ(from_f32(x), h);
      ASSERT_EQ(from_f64(static_cast<double>(f16::from_bits(h))), h);
    }
  }
}

TEST(F16, IsADTypeOfTwoBytes) {
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_name(DType::f16), "f16");
  EXPECT_EQ(dtype_from_name("f16"), DType::f16);
  EXPECT_EQ(dtype_of<f16>(), DType::f16);
  EXPECT_TRUE(is_floating(DType::f16));
  EXPECT_TRUE(widens_to_f32(DType::f16) && widens_to_f32(DType::bf16));
  EXPECT_FALSE(widens_to_f32(DType::f32));
  // Appended: the values of the older dtypes stay as they were.
  EXPECT_EQ(static_cast<int>(DType::u8), 5);
  EXPECT_EQ(static_cast<int>(DType::f16), 6);
}

}  // namespace test_f16
}  // namespace meshtest
