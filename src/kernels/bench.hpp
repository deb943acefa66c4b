// Benchmark of a kernel family: every version timed on each configuration beside a baseline GEMM
// of the same shape measured in the same run (Eigen's f32 GEMM on the CPU; the GPU families',
// src/gpu/kernels/family.hpp, a cuBLAS bf16 GEMM), a table per configuration with the winner
// marked, wins per version, an overall winner and a recommendation.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/kernels/family.hpp"

namespace meshtest::kernels {

struct Timing {
  std::string version;  ///< a version's name, or the baseline's ("eigen f32", "cublas bf16")
  double mean_ms = 0, best_ms = 0, max_ms = 0, std_ms = 0;
  double tflops = 0;       ///< from the mean time
  double best_tflops = 0;  ///< from the best time
};

/// The Timing of `name` from the times of its runs (milliseconds, at least one) and the flops
/// of one run: mean, best, max, population std, TFLOP/s at the mean and at the best time.
Timing summarize_runs(std::string name, std::span<const double> ms, double flops);

struct ConfigBench {
  Config config;
  std::vector<Timing> versions;  ///< the versions timed on this configuration
  /// The baseline GEMM y = a · bᵀ, a [m, k], b [n, k] (the weight's layout): Eigen's f32 GEMM
  /// for the CPU families. The report's column "x <first word of its name>" ("x eigen").
  Timing baseline;
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

/// The report: per configuration a table (mean, best, max and std time, TFLOP/s at the mean
/// and at the best time, % of the best version's time, the baseline's time over the version's),
/// then wins per version, the overall winner (most wins; ties by total mean time) and the
/// recommendation. `versions` in order, the simplest first; a version absent from a configuration's
/// timings (not timed there) neither wins it nor enters the winner's speed ratio there.
std::string bench_report(std::string_view family, std::span<const std::string> versions,
                         std::span<const ConfigBench> results);
std::string bench_report(const Family& f, std::span<const ConfigBench> results);

/// The results as JSON lines, one per version and configuration (the baseline included), with
/// "x_<first word of the baseline's name>" the baseline's time over the version's.
std::string bench_json(std::string_view family, std::span<const ConfigBench> results);
std::string bench_json(const Family& f, std::span<const ConfigBench> results);

/// The names of f's versions, in order.
std::vector<std::string> version_names(const Family& f);

/// "device: <the CPU's model name>, <n> hardware threads" (from /proc/cpuinfo; "unknown CPU"
/// where it is not there): the CPU families' report names the machine it timed.
std::string cpu_device_line();

}  // namespace meshtest::kernels
