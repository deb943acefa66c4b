// bf16 bits on the device: exact widening to f32 and rounding to nearest even (NaN kept quiet,
// with its sign), as the host's conversion (src/core/dtype.hpp), and f32 or bf16 buffers read and
// written as f32. For the .cu files of src/gpu.
#pragma once

#include <cstdint>

namespace meshtest::gpu::detail {

__device__ __forceinline__ float widen(std::uint16_t b) {
  return __uint_as_float(static_cast<unsigned>(b) << 16);
}

__device__ __forceinline__ std::uint16_t narrow(float x) {
  const unsigned u = __float_as_uint(x);
  if (isnan(x)) return static_cast<std::uint16_t>((u & 0x80000000u) != 0 ? 0xffc0u : 0x7fc0u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// Element i of a buffer of f32 or bf16 bits (S = std::uint16_t) as f32.
template <class S>
__device__ __forceinline__ float load(const S* p, std::int64_t i) {
  if constexpr (sizeof(S) == 2) {
    return widen(p[i]);
  } else {
    return p[i];
  }
}

/// Stores f32 v at element i, rounded to bf16 (to nearest even) for S = std::uint16_t.
template <class S>
__device__ __forceinline__ void store(S* p, std::int64_t i, float v) {
  if constexpr (sizeof(S) == 2) {
    p[i] = narrow(v);
  } else {
    p[i] = v;
  }
}

}  // namespace meshtest::gpu::detail
