// f16_bits: IEEE 754 binary16 to and from binary32 and binary64 on bit patterns, in plain integer
// code (C++17, no Eigen or fmt) that host code and CUDA kernels share, so both convert alike.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MESHTEST_HOST_DEVICE __host__ __device__
#else
#define MESHTEST_HOST_DEVICE
#endif

namespace meshtest::f16_bits {

// binary16: the sign (bit 15), 5 exponent bits (bias 15), 10 fraction bits.
inline constexpr std::uint16_t kSign = 0x8000;
inline constexpr std::uint16_t kExponent = 0x7c00;  // all ones: +Inf with a zero fraction
inline constexpr std::uint16_t kFraction = 0x03ff;
inline constexpr std::uint16_t kQuiet = 0x0200;  // a NaN's quiet bit

namespace detail {

/// The binary16 nearest to the binary float whose bits are `bits` (type U, M fraction bits, an
/// exponent field whose all-ones value is EMax): one rounding, ties to even.
template <class U, int M, int EMax>
MESHTEST_HOST_DEVICE constexpr std::uint16_t narrow(U bits) {
  constexpr int kBias = EMax / 2;
  const auto sign = static_cast<std::uint16_t>((bits >> (8 * sizeof(U) - 16)) & kSign);
  const int e = static_cast<int>((bits >> M) & static_cast<U>(EMax));
  const U fraction = bits & ((U{1} << M) - 1);
  if (e == EMax) {  // Inf stays Inf; a NaN stays one: quiet, its payload's top 9 bits kept
    if (fraction == 0) return sign | kExponent;
    return static_cast<std::uint16_t>(sign | kExponent | kQuiet | (fraction >> (M - 10)));
  }
  const int x = e - kBias;              // the exponent of a normal source
  if (e == 0 || x < -25) return sign;   // below 2^-25, half the least subnormal: a zero
  if (x > 15) return sign | kExponent;  // 2^16 or more: past 65520, the halfway to Inf
  const U significand = fraction | (U{1} << M);
  // Keep 10 fraction bits of a normal result (x >= -14), fewer of a subnormal one, whose unit
  // is 2^-24.
  const int shift = x >= -14 ? M - 10 : M - 10 + (-14 - x);
  U kept = significand >> shift;
  const U rest = significand & ((U{1} << shift) - 1);
  const U half = U{1} << (shift - 1);
  if (rest > half || (rest == half && (kept & 1) != 0)) ++kept;
  // A normal: kept holds the leading 1 (0x400) on top of the exponent field x + 14, so a carry
  // out of the fraction moves to the next binade (65504's to Inf). A subnormal: kept is the
  // field itself, 0x400 when it rounds up to the least normal.
  const U base = x >= -14 ? static_cast<U>(x + 14) << 10 : U{0};
  return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(base + kept));
}

}  // namespace detail

/// binary32 -> binary16, rounded to nearest even; overflow gives Inf of the sign; a NaN gives a
/// quiet NaN of the same sign with the top 9 bits of its payload.
MESHTEST_HOST_DEVICE constexpr std::uint16_t from_f32(std::uint32_t bits) {
  return detail::narrow<std::uint32_t, 23, 0xff>(bits);
}

/// binary64 -> binary16 in one rounding (never through binary32), as from_f32.
MESHTEST_HOST_DEVICE constexpr std::uint16_t from_f64(std::uint64_t bits) {
  return detail::narrow<std::uint64_t, 52, 0x7ff>(bits);
}

/// binary16 -> binary32, exact: every value, Inf and NaN (sign and payload) as it is.
MESHTEST_HOST_DEVICE constexpr std::uint32_t to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & kSign) << 16;
  const int e = (h & kExponent) >> 10;
  std::uint32_t fraction = h & kFraction;
  if (e == 0x1f) return sign | 0x7f800000u | (fraction << 13);
  if (e != 0) return sign | (static_cast<std::uint32_t>(e - 15 + 127) << 23) | (fraction << 13);
  if (fraction == 0) return sign;
  // A subnormal, fraction * 2^-24: shifted until its leading 1 sits at bit 10 (2^-14).
  int exponent = -14;
  while ((fraction & 0x400u) == 0) {
    fraction <<= 1;
    --exponent;
  }
  return sign | (static_cast<std::uint32_t>(exponent + 127) << 23) | ((fraction & kFraction) << 13);
}

}  // namespace meshtest::f16_bits
