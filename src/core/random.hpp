// Counter-based random tensors (Philox-4x32-10): element i depends only on (key, i).
#pragma once

#include <array>
#include <cstdint>
#include <variant>

#include "src/core/tensor.hpp"

namespace meshtest {

/// Names one random stream. Element i of every generated tensor is a pure function of
/// (seed, stream, i), so any rank can generate any shard of the same global tensor, and
/// DP noise can be keyed by e.g. {.seed = seed, .stream = (step << 32) | param}.
struct RandomKey {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;
};

/// Normal(mean, std) via Box–Muller; floating dtypes only.
struct Normal {
  double mean = 0.0;
  double std = 1.0;
};
/// Uniform on [lo, hi) in double; after rounding to f32/bf16/f16 a value may equal hi.
/// Floating dtypes only.
struct Uniform {
  double lo = 0.0;
  double hi = 1.0;
};
/// Integers uniform on [lo, hi] inclusive; any dtype (floats hold small exact integers,
/// e.g. for bit-exact CCL tests). lo..hi must be exactly representable in the dtype.
struct Integers {
  std::int64_t lo = 0;
  std::int64_t hi = 1;
};
using Distribution = std::variant<Normal, Uniform, Integers>;

/// The Philox4x32 bijection with 10 rounds (Salmon et al., SC'11; Random123's philox4x32_10).
std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter,
                                           std::array<std::uint32_t, 2> key);

/// The four Philox words of element i: counter (lo i, hi i, lo stream, hi stream), key seed.
std::array<std::uint32_t, 4> random_bits_at(RandomKey key, std::uint64_t i);
/// Uniform double in [0, 1) with 53 random bits: (w1:w0 >> 11) * 2^-53.
double uniform_at(RandomKey key, std::uint64_t i);
/// Standard normal by Box–Muller: sqrt(-2 ln u1) cos(2 pi u2), u1 in (0, 1] from w1:w0,
/// u2 in [0, 1) from w3:w2. Uses std::log/std::cos, so bit-exact per libm, not across libms.
double normal_at(RandomKey key, std::uint64_t i);
/// Integer uniform on [lo, hi] inclusive: lo + floor(x * n / 2^64) with x = w1:w0 and
/// n = hi - lo + 1 (bias below n / 2^64). Throws Error if lo > hi.
std::int64_t integer_at(RandomKey key, std::uint64_t i, std::int64_t lo, std::int64_t hi);

/// Whole tensor of `shape`: element i (flat, row-major) is drawn from `dist` at index i.
/// f32/bf16/f16 values are rounded from the double value (same as Tensor::astype from f64).
Tensor generate(Shape shape, DType dtype, RandomKey key, const Distribution& dist);
/// Only the slice [r.start, r.start + r.size) along `dim` of the global tensor `global`;
/// bit-for-bit equal to generate(global, ...).slice(dim, r), without building the whole.
Tensor generate_slice(Shape global, int dim, Range r, DType dtype, RandomKey key,
                      const Distribution& dist);

/// generate() with Normal{mean, std}.
Tensor random_normal(Shape shape, DType dtype, RandomKey key, double mean = 0.0, double std = 1.0);
/// generate() with Uniform{lo, hi}.
Tensor random_uniform(Shape shape, DType dtype, RandomKey key, double lo = 0.0, double hi = 1.0);
/// generate() with Integers{lo, hi} (inclusive).
Tensor random_integers(Shape shape, DType dtype, RandomKey key, std::int64_t lo, std::int64_t hi);

}  // namespace meshtest
