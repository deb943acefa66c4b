// fp8 e4m3fn and e5m2: a table of the 256 values per format for decode, and an encoder that
// rounds in the format's quantum (a power of two, so the division is exact) with nearbyint.
#include "src/core/fp8.hpp"

#include <array>
#include <cmath>
#include <limits>

namespace meshtest {

namespace {

struct Fp8Layout {
  int mantissa_bits;
  int bias;
  std::uint8_t max_code;  ///< the largest finite value's code
  bool ieee;              ///< an all-ones exponent field holds inf and NaN (e5m2)
};

constexpr Fp8Layout layout(Fp8Format f) {
  return f == Fp8Format::e4m3fn ? Fp8Layout{3, 7, 0x7e, false} : Fp8Layout{2, 15, 0x7b, true};
}

float decode_slow(std::uint8_t code, Fp8Format f) {
  const Fp8Layout l = layout(f);
  const int exponent_mask = (1 << (7 - l.mantissa_bits)) - 1;
  const int e = (code >> l.mantissa_bits) & exponent_mask;
  const int m = code & ((1 << l.mantissa_bits) - 1);
  const bool negative = (code & 0x80) != 0;
  if (!l.ieee && (code & 0x7f) == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  if (l.ieee && e == exponent_mask) {
    if (m != 0) return std::numeric_limits<float>::quiet_NaN();
    return negative ? -std::numeric_limits<float>::infinity()
                    : std::numeric_limits<float>::infinity();
  }
  const double v = e == 0 ? std::ldexp(m, 1 - l.bias - l.mantissa_bits)
                          : std::ldexp((1 << l.mantissa_bits) + m, e - l.bias - l.mantissa_bits);
  return static_cast<float>(negative ? -v : v);
}

using Table = std::array<float, 256>;

const Table& table(Fp8Format f) {
  static const std::array<Table, 2> tables = [] {
    std::array<Table, 2> t{};
    for (Fp8Format g : kFp8Formats) {
      for (int c = 0; c < 256; ++c) {
        t[static_cast<std::size_t>(g)][static_cast<std::size_t>(c)] =
            decode_slow(static_cast<std::uint8_t>(c), g);
      }
    }
    return t;
  }();
  return tables[static_cast<std::size_t>(f)];
}

}  // namespace

std::string_view fp8_name(Fp8Format f) { return f == Fp8Format::e4m3fn ? "e4m3fn" : "e5m2"; }

float fp8_max(Fp8Format f) { return f == Fp8Format::e4m3fn ? 448.0f : 57344.0f; }

float fp8_decode(std::uint8_t code, Fp8Format f) { return table(f)[code]; }

std::uint8_t fp8_encode(float x, Fp8Format f) {
  const Fp8Layout l = layout(f);
  const auto sign = static_cast<std::uint8_t>(std::signbit(x) ? 0x80 : 0);
  if (std::isnan(x)) return static_cast<std::uint8_t>(sign | 0x7f);
  const double a = std::fabs(static_cast<double>(x));
  if (a >= fp8_max(f)) return static_cast<std::uint8_t>(sign | l.max_code);  // inf too
  if (a == 0) return sign;
  // The quantum of a's binade (the subnormals share the smallest normal binade's quantum).
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  const int exponent = std::max(e - 1, 1 - l.bias);
  const double quantum = std::ldexp(1.0, exponent - l.mantissa_bits);
  const double n = std::nearbyint(a / quantum);  // ties to even: the code's mantissa bit 0
  if (n == 0) return sign;                       // rounds to zero
  // n * quantum back to fields; n may be 2^(mantissa_bits + 1): the next binade, mantissa 0.
  const double r = n * quantum;
  std::frexp(r, &e);
  if (e - 1 < 1 - l.bias) return static_cast<std::uint8_t>(sign | static_cast<int>(n));
  const int field = e - 1 + l.bias;
  const int mantissa =
      static_cast<int>(std::ldexp(r, l.mantissa_bits - (e - 1))) - (1 << l.mantissa_bits);
  return static_cast<std::uint8_t>(sign | (field << l.mantissa_bits) | mantissa);
}

}  // namespace meshtest
