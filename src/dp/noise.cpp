// add_noise from the counter-based normal generator.
#include "src/dp/noise.hpp"

#include <cmath>

#include "src/dp/clip.hpp"
#include "src/ops/visit_real.hpp"

namespace meshtest::dp {

RandomKey noise_key(std::uint64_t seed, std::int64_t step, std::int64_t param) {
  MESHTEST_CHECK(step >= 0 && param >= 0 && param < (std::int64_t{1} << 32),
                 "noise_key: step {} and parameter {} must be >= 0 (parameter < 2^32)", step,
                 param);
  return {.seed = seed,
          .stream = (static_cast<std::uint64_t>(step) << 32) | static_cast<std::uint64_t>(param)};
}

void check_noise(const NoiseOptions& noise, const char* who) {
  MESHTEST_CHECK(std::isfinite(noise.sigma) && noise.sigma >= 0,
                 "{}: noise multiplier sigma is {}, expected a finite sigma >= 0", who,
                 noise.sigma);
}

void add_noise(Tensor& flat, std::int64_t offset, std::int64_t param, std::int64_t step,
               const NoiseOptions& noise, double clip, double divisor) {
  check_noise(noise, "add_noise");
  check_clip(clip, "add_noise");
  MESHTEST_CHECK(divisor > 0 && offset >= 0, "add_noise: divisor {} must be > 0, offset {} >= 0",
                 divisor, offset);
  if (noise.sigma == 0) return;
  const RandomKey key = noise_key(noise.seed, step, param);
  const double std = noise.sigma * clip / divisor;
  visit_real(flat.dtype(), "add_noise", [&]<class S>(type_tag<S>) {
    S* p = flat.data<S>();
    for (std::int64_t j = 0; j < flat.numel(); ++j) {
      p[j] += static_cast<S>(std * normal_at(key, static_cast<std::uint64_t>(offset + j)));
    }
  });
}

}  // namespace meshtest::dp
