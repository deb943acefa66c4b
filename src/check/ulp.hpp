// ULP distance: how many representable values lie between two floats of the same format.
#pragma once

#include <cstdint>
#include <limits>

#include "src/core/tensor.hpp"

namespace meshtest {

/// Distance reported when either value is NaN.
inline constexpr std::uint64_t kUlpNaN = std::numeric_limits<std::uint64_t>::max();

/// Ordered-integer distance of the bit patterns: adjacent values are 1 apart, -0 and +0 are 0
/// apart, the largest finite value and Inf are 1 apart; NaN gives kUlpNaN.
std::uint64_t ulp_distance(float a, float b);
std::uint64_t ulp_distance(double a, double b);
std::uint64_t ulp_distance(bf16 a, bf16 b);
std::uint64_t ulp_distance(f16 a, f16 b);

/// Largest element-wise ulp_distance, in the tensors' own dtype (f32, f64, bf16 or f16; both the
/// same). Throws meshtest::Error for other or differing dtypes and for differing shapes.
/// 0 when empty.
std::uint64_t ulp_distance(const Tensor& expected, const Tensor& got);

}  // namespace meshtest
