// End-to-end timing statistics and measurements.json (aggregated per-op figures and totals).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "src/perf/aggregate.hpp"

namespace meshtest::perf {

/// Statistics of measured end-to-end iteration times (warm-up iterations excluded).
struct E2eStats {
  int warmup = 0;
  int iterations = 0;
  double mean_us = 0;
  double min_us = 0;
  double max_us = 0;
  double std_us = 0;  ///< population standard deviation (divides by n)
};

/// Mean, min, max and std of `times_us` (the measured iterations). Throws Error when empty or
/// when a time is negative or not finite.
E2eStats e2e_stats(std::span<const double> times_us, int warmup);

/// measurements.json: {"name", "devices", "iterations", "total_kernel_duration_us",
/// "total_op_to_op_latency_us", "ops": [{index, op_code, op_type, attributes, devices,
/// kernel_duration_us, op_to_op_latency_us}], "e2e": {warmup, iterations, mean_us, min_us,
/// max_us, std_us} (only when given)}.
std::string measurements_json(std::string_view name, const Aggregate& a,
                              const std::optional<E2eStats>& e2e = std::nullopt);

/// The aggregated per-op table as text: index, op, type, devices, average kernel duration and
/// op-to-op latency (µs), attributes; then the totals.
std::string summary_table(const Aggregate& a);

}  // namespace meshtest::perf
