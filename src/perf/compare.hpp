// Config comparison of two ops_perf reports (docs/perf.md): a fused-op unit test against
// the module that contains it, and a single-device run against device 0 of a multi-device run.
#pragma once

#include <string>
#include <vector>

#include "src/perf/ops_csv.hpp"

namespace meshtest::perf {

struct CompareOptions {
  int unit_iterations = 0;    ///< how the unit report's region splits (AggregateOptions)
  int module_iterations = 0;  ///< how the module report's region splits
};

/// The outcome: ok, the mismatches or failure reasons (one line each), and a summary line.
struct CompareResult {
  bool ok = false;
  std::vector<std::string> problems;
  std::string summary;
};

/// Finds the first measured iteration of `unit` (lowest device id) as a contiguous run of op
/// codes in the first measured iteration of `module` (lowest device id). It must occur exactly
/// once: no occurrence is "no matching subsequence", several are "ambiguous". The matched ops
/// are then compared on attributes and every INPUT_/OUTPUT_ field; each mismatch names the op,
/// both files' lines and the field. Throws Error only as measured_region does.
CompareResult compare_configs(const OpsReport& unit, const OpsReport& module,
                              const CompareOptions& opts = {});

/// Compares a single-device report with device 0 (the lowest device id) of a multi-device
/// report, op by op over their first measured iterations: op codes and the W, Z, Y, X of every
/// input and output. Throws Error when `single` holds more than one device.
CompareResult compare_shapes(const OpsReport& single, const OpsReport& multi,
                             const CompareOptions& opts = {});

}  // namespace meshtest::perf
