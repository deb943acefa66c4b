// The experts section of meshtest-bench fused: the fused experts op (src/ops/moe/experts.hpp)
// against the MLP block's own op sequence and against a dense-gather reference, single device.
#pragma once

#include <cstdint>
#include <string>

#include "src/core/dtype.hpp"

namespace meshtest::bench {

/// Sizes and repetitions of the experts section. The defaults (T = 1024, E = 32, k = 4, hidden =
/// I = 512, f32) run in 7 to 18 s on 2 shared cores; gpt-oss-20b's widths are hidden = I = 2880
/// (about 36 x the GEMM work and 32 x the dense gather's traffic).
struct ExpertsBenchOptions {
  std::int64_t tokens = 1024;
  std::int64_t hidden = 512;
  std::int64_t intermediate = 512;
  std::int64_t experts = 32;
  std::int64_t k = 4;
  DType dtype = DType::f32;
  int iters = 5;      ///< measured calls per figure (median and min reported)
  int warmup = 1;     ///< warm-up calls per figure
  bool dense = true;  ///< also time the dense-gather reference (the slow one)
  std::uint64_t seed = 12;
};

/// The section's figures (milliseconds per call, medians) and its correctness checks.
struct ExpertsBenchResult {
  double fused_ms = 0, sequence_ms = 0, dense_ms = 0;  ///< dense_ms 0 when not run
  double sequence_error = 0, dense_error = 0;          ///< max |ref - fused| / max(1, max |ref|)
  bool outputs_agree = false;                          ///< both errors within the dtype's bound
};

/// Builds seeded weights and t [T, hidden], runs experts, experts_reference and (when o.dense)
/// the dense gather — for each token and each of its k experts, that expert's matrices applied
/// to the token alone (matrix-vector products: every token reads its k experts' weights, the
/// computation of the published reference's gathered einsum) — checks that the three outputs
/// agree and prints a table with the times and the ratios, and the issue-12 target (fused >= 2 x
/// faster than the dense gather at T = 1024, E = 32, k = 4). Throws Error for sizes < 1 or k
/// outside [1, E].
ExpertsBenchResult experts_section(const ExpertsBenchOptions& o);

}  // namespace meshtest::bench
