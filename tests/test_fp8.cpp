// fp8 e4m3fn and e5m2 against references of their own: every one of the 256 codes decoded by
// its bit fields with ldexp and against crafted values, and the encoder against a brute-force
// search for the nearest code (ties to the even code, saturating) on every code, every
// midpoint between neighbouring codes and its two neighbouring floats, and random floats over
// the whole range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "src/core/fp8.hpp"

namespace meshtest {
namespace test_fp8 {

struct Fields {
  int exponent_bits, mantissa_bits, bias;
};

Fields fields(Fp8Format f) { return f == Fp8Format::e4m3fn ? Fields{4, 3, 7} : Fields{5, 2, 15}; }

bool is_nan_code(int c, Fp8Format f) {
  if (f == Fp8Format::e4m3fn) return (c & 0x7f) == 0x7f;
  return (c & 0x7c) == 0x7c && (c & 0x03) != 0;
}

bool is_inf_code(int c, Fp8Format f) { return f == Fp8Format::e5m2 && (c & 0x7f) == 0x7c; }

/// The value of code c from the format's definition: (-1)^s * 2^(e - bias) * (1 + m / 2^M),
/// or 2^(1 - bias) * m / 2^M for e == 0.
double reference_value(int c, Fp8Format f) {
  const Fields d = fields(f);
  const int s = c >> 7;
  const int e = (c >> d.mantissa_bits) & ((1 << d.exponent_bits) - 1);
  const int m = c & ((1 << d.mantissa_bits) - 1);
  const double frac = static_cast<double>(m) / (1 << d.mantissa_bits);
  const double v =
      e == 0 ? std::pow(2.0, 1 - d.bias) * frac : std::pow(2.0, e - d.bias) * (1 + frac);
  return s != 0 ? -v : v;
}

/// The finite codes, for the brute-force encoder.
std::vector<int> finite_codes(Fp8Format f) {
  std::vector<int> out;
  for (int c = 0; c < 256; ++c) {
    if (!is_nan_code(c, f) && !is_inf_code(c, f)) out.push_back(c);
  }
  return out;
}

/// The nearest finite code to x (in f64), ties to the code with mantissa bit 0 clear; beyond
/// the largest value, the largest of x's sign; a zero keeps x's sign.
int brute_force_encode(double x, Fp8Format f) {
  const int sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7f;
  int best = -1;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int c : finite_codes(f)) {
    if ((c & 0x80) != sign) continue;
    const double d = std::fabs(reference_value(c, f) - x);
    if (d < best_distance || (d == best_distance && (c & 1) == 0)) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

class Fp8 : public ::testing::TestWithParam<Fp8Format> {};

TEST_P(Fp8, EveryCodeDecodesToItsDefinedValue) {
  const Fp8Format f = GetParam();
  for (int c = 0; c < 256; ++c) {
    const float v = fp8_decode(static_cast<std::uint8_t>(c), f);
    if (is_nan_code(c, f)) {
      EXPECT_TRUE(std::isnan(v)) << c;
    } else if (is_inf_code(c, f)) {
      EXPECT_EQ(v, (c & 0x80) != 0 ? -INFINITY : INFINITY) << c;
    } else {
      EXPECT_EQ(static_cast<double>(v), reference_value(c, f)) << "code " << c;
      EXPECT_EQ(std::signbit(v), (c & 0x80) != 0) << "code " << c;
    }
  }
}

TEST(Fp8Values, CraftedCodes) {
  const auto e4 = [](int c) { return fp8_decode(static_cast<std::uint8_t>(c), Fp8Format::e4m3fn); };
  const auto e5 = [](int c) { return fp8_decode(static_cast<std::uint8_t>(c), Fp8Format::e5m2); };
  EXPECT_EQ(e4(0x38), 1.0f);    // 0 0111 000
  EXPECT_EQ(e4(0x7e), 448.0f);  // the largest
  EXPECT_EQ(e4(0xfe), -448.0f);
  EXPECT_EQ(e4(0x08), 0.015625f);     // 2^-6, the smallest normal
  EXPECT_EQ(e4(0x01), 0.001953125f);  // 2^-9, the smallest subnormal
  EXPECT_EQ(e4(0x07), 0.013671875f);  // 7/8 * 2^-6
  EXPECT_TRUE(std::isnan(e4(0x7f)) && std::isnan(e4(0xff)));
  EXPECT_EQ(e4(0x78), 256.0f);    // no infinity: 0 1111 000 is finite
  EXPECT_EQ(e5(0x3c), 1.0f);      // 0 01111 00
  EXPECT_EQ(e5(0x7b), 57344.0f);  // the largest
  EXPECT_EQ(e5(0x7c), INFINITY);
  EXPECT_EQ(e5(0xfc), -INFINITY);
  EXPECT_TRUE(std::isnan(e5(0x7d)) && std::isnan(e5(0x7e)) && std::isnan(e5(0x7f)));
  EXPECT_EQ(e5(0x04), 6.103515625e-05f);    // 2^-14
  EXPECT_EQ(e5(0x01), 1.52587890625e-05f);  // 2^-16
  EXPECT_EQ(fp8_max(Fp8Format::e4m3fn), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Format::e5m2), 57344.0f);
}

TEST_P(Fp8, EveryFiniteCodeEncodesBackToItself) {
  const Fp8Format f = GetParam();
  for (int c : finite_codes(f)) {
    EXPECT_EQ(fp8_encode(fp8_decode(static_cast<std::uint8_t>(c), f), f), c) << "code " << c;
  }
}

TEST_P(Fp8, MidpointsRoundToTheEvenCodeAndTheirNeighboursToTheNearest) {
  const Fp8Format f = GetParam();
  std::vector<int> positive;
  for (int c : finite_codes(f)) {
    if (c < 0x80) positive.push_back(c);
  }
  int checked = 0;
  for (std::size_t i = 0; i + 1 < positive.size(); ++i) {
    const double lo = reference_value(positive[i], f), hi = reference_value(positive[i + 1], f);
    const auto mid = static_cast<float>((lo + hi) / 2);  // exact: a few bits more than fp8
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      for (float s : {x, -x}) {
        EXPECT_EQ(fp8_encode(s, f), brute_force_encode(s, f)) << s;
        ++checked;
      }
    }
    EXPECT_EQ(fp8_encode(mid, f) & 1, 0) << "a tie goes to the even code: " << mid;
  }
  EXPECT_GT(checked, 6 * 100);
}

TEST_P(Fp8, RandomFloatsOverTheWholeRangeEncodeAsTheNearestCode) {
  const Fp8Format f = GetParam();
  std::mt19937 gen(20261124);
  // log-uniform magnitudes from far below the smallest subnormal to far beyond the largest
  std::uniform_real_distribution<double> exponent(-24, 20);
  for (int i = 0; i < 20000; ++i) {
    const auto x = static_cast<float>((i % 2 == 0 ? 1 : -1) * std::exp2(exponent(gen)));
    ASSERT_EQ(fp8_encode(x, f), brute_force_encode(x, f)) << x;
  }
}

TEST_P(Fp8, SpecialValuesFollowTheSaturatingRule) {
  const Fp8Format f = GetParam();
  const int max_code = f == Fp8Format::e4m3fn ? 0x7e : 0x7b;
  EXPECT_EQ(fp8_encode(INFINITY, f), max_code);
  EXPECT_EQ(fp8_encode(-INFINITY, f), 0x80 | max_code);
  EXPECT_EQ(fp8_encode(1e30f, f), max_code);
  EXPECT_EQ(fp8_encode(std::numeric_limits<float>::max(), f), max_code);
  EXPECT_EQ(fp8_encode(std::nanf(""), f), 0x7f);
  EXPECT_EQ(fp8_encode(-std::nanf(""), f), 0xff);
  EXPECT_EQ(fp8_encode(0.0f, f), 0x00);
  EXPECT_EQ(fp8_encode(-0.0f, f), 0x80);
  EXPECT_EQ(fp8_encode(std::numeric_limits<float>::denorm_min(), f), 0x00);
  EXPECT_EQ(fp8_encode(-std::numeric_limits<float>::denorm_min(), f), 0x80);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8, ::testing::ValuesIn(kFp8Formats),
                         [](const auto& info) { return std::string(fp8_name(info.param)); });

}  // namespace test_fp8
}  // namespace meshtest
