// f16: the IEEE 754 binary16 element type of DType::f16, a storage type with exact widening.
#pragma once

#include <Eigen/Core>

#include <bit>
#include <concepts>
#include <cstdint>
#include <type_traits>

#include "src/core/f16_bits.hpp"

namespace meshtest {

/// IEEE 754 binary16 (1 sign, 5 exponent and 10 fraction bits): a storage type with explicit
/// conversions and no arithmetic of its own (widen, compute in f32, narrow, as for bf16).
/// To f16: one rounding to nearest, ties to even, from f32, f64 (directly, not through f32),
/// bf16 and integers; past 65504 + half an ulp it is Inf of the sign; a NaN stays a NaN of its
/// sign (made quiet, the top 9 bits of its payload kept). From f16: exact (f32, f64, bf16 by
/// one rounding of the f32 value; integers truncate as from f32).
struct f16 {
  std::uint16_t bits = 0;

  constexpr f16() = default;
  constexpr explicit f16(float x) : bits(f16_bits::from_f32(std::bit_cast<std::uint32_t>(x))) {}
  constexpr explicit f16(double x) : bits(f16_bits::from_f64(std::bit_cast<std::uint64_t>(x))) {}
  /// Exact for |x| < 2^53; any larger integer is far past the largest f16 (Inf either way).
  template <std::integral I>
  constexpr explicit f16(I x) : f16(static_cast<double>(x)) {}
  explicit f16(Eigen::bfloat16 x) : f16(static_cast<float>(x)) {}

  /// The f16 whose bit pattern is `b`.
  static constexpr f16 from_bits(std::uint16_t b) {
    f16 h;
    h.bits = b;
    return h;
  }

  constexpr explicit operator float() const { return std::bit_cast<float>(f16_bits::to_f32(bits)); }
  template <class T>
  requires std::is_arithmetic_v<T> &&(!std::is_same_v<T, float>)constexpr explicit operator T()
      const {
    return static_cast<T>(static_cast<float>(*this));
  }
};

static_assert(sizeof(f16) == 2 && std::is_trivially_copyable_v<f16>);

}  // namespace meshtest
