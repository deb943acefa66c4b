// Benchmark of a kernel family: every version timed on each configuration beside Eigen's f32
// GEMM of the same shape (the baseline measured in the same run), a table per configuration
// with the winner marked, wins per version, an overall winner and a recommendation.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "src/kernels/family.hpp"

namespace meshtest::kernels {

struct Timing {
  std::string version;  ///< a version's name, or "eigen f32" for the baseline
  double mean_ms = 0, best_ms = 0, std_ms = 0;
  double tflops = 0;  ///< from the mean time
};

struct ConfigBench {
  Config config;
  std::vector<Timing> versions;
  Timing eigen;  ///< Eigen's f32 GEMM y = a · bᵀ, a [m, k], b [n, k] (the weight's layout)
};

struct BenchOptions {
  int warmup = 2;
  int iterations = 10;
};

/// Times every version of f and the baseline on each configuration.
std::vector<ConfigBench> bench_family(const Family& f, std::span<const Config> configs,
                                      const BenchOptions& opt);

/// What the recommendation says of the winner against the simplest version (the family's
/// first), from `speedup`, the geometric mean over the configurations of simplest time /
/// winner time: slower or under 5 % faster, prefer the simpler one; 5 to 10 %, weigh the
/// complexity; over 10 %, take the faster.
std::string recommendation(const std::string& simplest, const std::string& winner, double speedup);

/// The report: per configuration a table (mean, best, std, TFLOP/s, % of the best version's
/// time, fraction of Eigen f32), then wins per version, the overall winner (most wins; ties by
/// total mean time) and the recommendation.
std::string bench_report(const Family& f, std::span<const ConfigBench> results);

/// The results as JSON lines, one per version and configuration (the baseline included).
std::string bench_json(const Family& f, std::span<const ConfigBench> results);

}  // namespace meshtest::kernels
