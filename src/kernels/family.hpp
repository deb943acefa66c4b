// Kernel families: several versions of one kernel, a reference, and the configurations they
// are checked on. A family is a few lines (src/kernels/fp8_matmul.cpp is one); the correctness
// suite runs every version against the reference on every configuration and reports the
// error of each.
//
// Error measures, for a version's output y and the reference r (both [m, n]):
//   relative error of element i = |y_i - r_i| / max_j |r_j|   (normwise: an element near zero
//   after cancellation is measured against the output's scale, not its own)
//   max and mean of those, the max absolute error, and the PCC of y against r.
// A version passes a configuration when its max relative error is <= the tolerance.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/tensor.hpp"

namespace meshtest::kernels {

/// One problem size: y [m, n] from operands with inner dim k, quantized in blocks of `block`.
struct Config {
  std::string name;  ///< "small", "non-aligned", ...
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t block = 128;
  double tolerance = 1e-4;  ///< on the max relative error
};

/// A family's operands for one configuration (their meaning is the family's).
struct Inputs {
  Config config;
  std::vector<Tensor> tensors;
};

using KernelFn = std::function<Tensor(const Inputs&)>;

struct Version {
  std::string name;         ///< "v1"
  std::string description;  ///< one line
  KernelFn run;             ///< f32 [m, n]
};

struct Family {
  std::string name;
  std::string description;
  std::function<Inputs(const Config&)> make_inputs;  ///< deterministic
  KernelFn reference;                                ///< f64 [m, n]
  std::vector<Version> versions;
  std::vector<Config> configs;        ///< the full suite
  std::vector<Config> quick_configs;  ///< small sizes (--quick, and the unit test)
  /// Floating-point operations of one run (2 m n k for a matmul), for TFLOP/s.
  std::function<double(const Config&)> flops;
};

/// Every family, in a fixed order (the registry: families.cpp).
const std::vector<Family>& families();
/// The family called `name`; throws Error naming the known ones.
const Family& family(std::string_view name);
/// The version of f called `name`; throws Error naming the family's versions.
const Version& version(const Family& f, std::string_view name);

/// One version on one configuration.
struct Check {
  std::string family, version, config;
  double max_rel = 0, mean_rel = 0, max_abs = 0, pcc = 0;
  double tolerance = 0;
  bool pass = false;
};

/// The errors of y against the reference r (see the top of this file).
Check measure(const Tensor& reference, const Tensor& y, double tolerance);
/// Every version of f on every configuration of `configs` (the reference computed once per
/// configuration).
std::vector<Check> check_family(const Family& f, std::span<const Config> configs);
/// The correctness report: a table per configuration (version, max rel, mean rel, max abs, PCC,
/// PASS/FAIL), then a line per version ("v2: PASS on 5 of 5 configurations") and a summary.
std::string correctness_report(std::span<const Check> checks);
/// True when every check passed.
bool all_pass(std::span<const Check> checks);

}  // namespace meshtest::kernels
