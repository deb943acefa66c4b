// Shared helpers of the meshtest-bench fused sections (bench/fused_experts.cpp,
// bench/fused_attention.cpp): timing of repeated calls and the scaled output error.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <utility>
#include <vector>

#include "src/check/metrics.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::bench {

/// Median and min milliseconds of `iters` calls of `f` after `warmup` calls; `out` keeps the
/// last result. iters >= 1 (the callers check it).
template <class T>
std::pair<double, double> time_calls_ms(int warmup, int iters, const std::function<T()>& f,
                                        T& out) {
  for (int i = 0; i < warmup; ++i) out = f();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    out = f();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

/// max |expected - got| / max(1, max |expected|): the error relative to the output's scale.
inline double scaled_error(const Tensor& expected, const Tensor& got) {
  return max_abs_error(expected, got) / std::max(1.0, to_f64(expected).abs().maxCoeff());
}

}  // namespace meshtest::bench
