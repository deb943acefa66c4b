// fp8 number formats: e4m3fn and e5m2 (the OCP 8-bit floating point formats), encode and
// decode.
//
//   e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinities: the codes 0x7f and
//           0xff are NaN and every other code is finite, so the largest value is
//           0x7e = 1.75 * 2^8 = 448. Subnormals (exponent field 0): m / 8 * 2^-6, the smallest
//           2^-9.
//   e5m2:   sign, 5 exponent bits (bias 15), 2 mantissa bits, as IEEE binary16 cut to 8 bits:
//           0x7c is +inf, 0x7d..0x7f NaN; the largest finite value 0x7b = 1.75 * 2^15 = 57344;
//           subnormals m / 4 * 2^-14, the smallest 2^-16.
//
// Encoding rule (the "saturating to finite" conversion): round to nearest, ties to the even
// code (mantissa bit 0 clear); a finite value beyond the largest finite one, and an infinity,
// become the largest finite value of its sign; NaN becomes NaN (0x7f, or 0xff when its sign bit
// is set). -0 is encoded as 0x80. Decode is exact into f32.
#pragma once

#include <cstdint>
#include <string_view>

namespace meshtest {

enum class Fp8Format : std::uint8_t { e4m3fn, e5m2 };

inline constexpr Fp8Format kFp8Formats[] = {Fp8Format::e4m3fn, Fp8Format::e5m2};

/// "e4m3fn" or "e5m2".
std::string_view fp8_name(Fp8Format f);
/// The largest finite value: 448 (e4m3fn) or 57344 (e5m2).
float fp8_max(Fp8Format f);
/// The value of `code` (exact; NaN for the NaN codes, ±inf for e5m2's infinities).
float fp8_decode(std::uint8_t code, Fp8Format f);
/// The code of x under the rule above.
std::uint8_t fp8_encode(float x, Fp8Format f);

}  // namespace meshtest
