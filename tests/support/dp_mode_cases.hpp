// The models, batches and clip norm the DP mode suites share (tests/test_dp_modes.cpp on the CPU,
// tests/gpu/test_gpu_dp_modes.cpp on a GPU model).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "src/core/random.hpp"
#include "src/dp/loss.hpp"
#include "src/dp/modes.hpp"
#include "src/dp/sequential.hpp"
#include "tests/support/dp_reference.hpp"

namespace meshtest::test_support {

struct DpModelCase {
  std::string spec;
  std::int64_t din, batch, seq;  ///< seq 0: 2-D inputs [B, din]
  dp::LossKind loss;
};

/// 2-D and 3-D inputs, both norm regimes of the hybrid rule, fused_bk keeping G and keeping
/// A_iᵀG_i, every layer kind, both losses.
inline const std::vector<DpModelCase>& dp_model_cases() {
  static const std::vector<DpModelCase> cases = {
      {"linear:6,relu,linear:4", 5, 5, 3, dp::LossKind::mse},
      {"linear:6,gelu,rmsnorm,linear:4", 5, 4, 0, dp::LossKind::ce},
      // direct (2T² > d_in d_out)
      {"linear:3,gelu,linear:3,relu,linear:2", 2, 4, 9, dp::LossKind::ce},
      {"rmsnorm,linear:7,gelu,linear:5,rmsnorm", 4, 3, 2, dp::LossKind::mse},
      // direct with d_in > T (fused_bk keeps G) then direct with d_in <= T (keeps A_iᵀG_i)
      {"linear:2,relu,linear:3", 10, 3, 4, dp::LossKind::mse},
  };
  return cases;
}

/// A batch for a model: x [B, (T,) din]; y mse targets or ce classes.
struct DpBatch {
  Tensor x, y;
};

inline DpBatch make_dp_batch(const dp::Sequential& m, std::int64_t b, std::int64_t t,
                             std::int64_t din, dp::LossKind loss, DType dt, std::uint64_t seed) {
  const Shape xs = t == 0 ? Shape{b, din} : Shape{b, t, din};
  DpBatch r{.x = random_normal(xs, dt, {.seed = seed}), .y = {}};
  const std::int64_t out = m.out_features(din);
  if (loss == dp::LossKind::mse) {
    r.y = random_normal(xs.with(xs.rank() - 1, out), dt, {.seed = seed + 1});
  } else {
    r.y = random_integers(t == 0 ? Shape{b} : Shape{b, t}, DType::i64, {.seed = seed + 1}, 0,
                          out - 1);
  }
  return r;
}

/// C = the median norm: about half the samples are clipped.
inline double median_clip(const dp::Sequential& m, const DpBatch& bt, dp::DpOptions opt) {
  std::vector<double> n = dp_reference(m, bt.x, bt.y, opt).norms;
  std::sort(n.begin(), n.end());
  return n[n.size() / 2];
}

}  // namespace meshtest::test_support
