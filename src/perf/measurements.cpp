// End-to-end statistics and measurements.json.
#include "src/perf/measurements.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "src/core/error.hpp"

namespace meshtest::perf {

E2eStats e2e_stats(std::span<const double> times_us, int warmup) {
  MESHTEST_CHECK(!times_us.empty(), "e2e statistics: no measured iterations");
  for (double t : times_us) {
    MESHTEST_CHECK(std::isfinite(t) && t >= 0,
                   "e2e statistics: times must be finite and >= 0, got {}", t);
  }
  const auto n = static_cast<double>(times_us.size());
  double sum = 0;
  for (double t : times_us) sum += t;
  const auto [lo, hi] = std::minmax_element(times_us.begin(), times_us.end());
  // The mean lies in [min, max]; the rounded sum / n can land one ulp outside (five equal
  // times of 0.007 give 0.007000000000000001), so it is clamped back.
  const double mean = std::clamp(sum / n, *lo, *hi);
  double sq = 0;
  for (double t : times_us) sq += (t - mean) * (t - mean);
  return {.warmup = warmup,
          .iterations = static_cast<int>(times_us.size()),
          .mean_us = mean,
          .min_us = *lo,
          .max_us = *hi,
          .std_us = std::sqrt(sq / n)};
}

std::string measurements_json(std::string_view name, const Aggregate& a,
                              const std::optional<E2eStats>& e2e) {
  nlohmann::json ops = nlohmann::json::array();
  for (const OpSummary& op : a.ops) {
    ops.push_back({{"index", op.index},
                   {"op_code", op.op_code},
                   {"op_type", op_type_name(op.op_type)},
                   {"attributes", op.attributes},
                   {"devices", op.devices},
                   {"kernel_duration_us", op.kernel_duration_us},
                   {"op_to_op_latency_us", op.op_to_op_latency_us}});
  }
  nlohmann::json j = {{"name", name},
                      {"devices", a.devices},
                      {"iterations", a.iterations},
                      {"total_kernel_duration_us", a.total_kernel_duration_us},
                      {"total_op_to_op_latency_us", a.total_op_to_op_latency_us},
                      {"ops", std::move(ops)}};
  if (e2e) {
    j["e2e"] = {{"warmup", e2e->warmup}, {"iterations", e2e->iterations}, {"mean_us", e2e->mean_us},
                {"min_us", e2e->min_us}, {"max_us", e2e->max_us},         {"std_us", e2e->std_us}};
  }
  return j.dump(2) + "\n";
}

std::string summary_table(const Aggregate& a) {
  std::string out = fmt::format("{:>3}  {:<20} {:<8} {:>7} {:>14} {:>14}  {}\n", "#", "op", "type",
                                "devices", "kernel us", "op-to-op us", "attributes");
  for (const OpSummary& op : a.ops) {
    out += fmt::format("{:>3}  {:<20} {:<8} {:>7} {:>14.3f} {:>14.3f}  {}\n", op.index, op.op_code,
                       op_type_name(op.op_type), op.devices, op.kernel_duration_us,
                       op.op_to_op_latency_us, op.attributes);
  }
  out += fmt::format(
      "{:>3}  {:<20} {:<8} {:>7} {:>14.3f} {:>14.3f}  (sums of the per-op "
      "averages over {} iterations; compute: slowest device, ccl: mean)\n",
      "", "total", "", a.devices, a.total_kernel_duration_us, a.total_op_to_op_latency_us,
      a.iterations);
  return out;
}

}  // namespace meshtest::perf
