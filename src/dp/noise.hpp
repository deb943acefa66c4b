// DP-SGD Gaussian noise keyed by (seed, step, parameter, element): shard-invariant.
#pragma once

#include <cstdint>

#include "src/core/random.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dp {

/// The noise of DP-SGD: N(0, (σC)²) per gradient element.
struct NoiseOptions {
  double sigma = 0;        ///< noise multiplier σ >= 0 (0: no noise)
  std::uint64_t seed = 0;  ///< the run's seed
};

/// The random stream of parameter `param` at step `step`: {seed, (step << 32) | param}.
RandomKey noise_key(std::uint64_t seed, std::int64_t step, std::int64_t param);

/// Adds σ·C·z_j / divisor to element j of `flat` for j in [0, n), with z_j the standard normal
/// at index offset + j of noise_key(seed, step, param): a shard [offset, offset + n) of a
/// parameter gets exactly the noise the whole parameter gets there. No-op for σ = 0.
///   flat: any shape (f32/f64), read as its n flat elements
/// Throws Error for σ < 0, C <= 0 or divisor <= 0.
void add_noise(Tensor& flat, std::int64_t offset, std::int64_t param, std::int64_t step,
               const NoiseOptions& noise, double clip, double divisor);

/// Throws Error unless σ is finite and >= 0; `who` names the caller.
void check_noise(const NoiseOptions& noise, const char* who);

}  // namespace meshtest::dp
