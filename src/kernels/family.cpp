// The correctness suite (the registry of families is families.cpp).
#include "src/kernels/family.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "src/check/metrics.hpp"
#include "src/core/error.hpp"

namespace meshtest::kernels {

Check measure(const Tensor& reference, const Tensor& y, double tolerance) {
  check_same_shape("kernel output", reference, y);
  const Eigen::ArrayXd r = to_f64(reference), v = to_f64(y);
  Check c;
  c.tolerance = tolerance;
  const double scale = r.size() > 0 ? r.abs().maxCoeff() : 0.0;
  const Eigen::ArrayXd abs = (v - r).abs();
  c.max_abs = abs.size() > 0 ? abs.maxCoeff() : 0.0;
  const double denom = std::max(scale, kRelErrorFloor);
  c.max_rel = c.max_abs / denom;
  c.mean_rel = abs.size() > 0 ? abs.mean() / denom : 0.0;
  c.pcc = r.size() > 1 ? pcc(r, v) : 1.0;
  // NaN anywhere fails (a NaN max_rel compares false).
  c.pass = c.max_rel <= tolerance && v.allFinite();
  return c;
}

std::vector<Check> check_family(const Family& f, std::span<const Config> configs) {
  std::vector<Check> out;
  for (const Config& config : configs) {
    const Inputs in = f.make_inputs(config);
    const Tensor r = f.reference(in);
    for (const Version& v : f.versions) {
      Check c = measure(r, v.run(in), config.tolerance);
      c.family = f.name;
      c.version = v.name;
      c.config = config.name;
      out.push_back(std::move(c));
    }
  }
  return out;
}

bool all_pass(std::span<const Check> checks) {
  return std::ranges::all_of(checks, [](const Check& c) { return c.pass; });
}

std::string correctness_report(std::span<const Check> checks) {
  std::string out;
  std::string at;
  for (const Check& c : checks) {
    if (c.family + "/" + c.config != at) {
      at = c.family + "/" + c.config;
      out += fmt::format("\n{} {} (tolerance {:.0e} on the max relative error)\n", c.family,
                         c.config, c.tolerance);
      out += fmt::format("  {:<10} {:>11} {:>11} {:>11} {:>12}  {}\n", "version", "max rel",
                         "mean rel", "max abs", "PCC", "result");
    }
    out += fmt::format("  {:<10} {:>11.3e} {:>11.3e} {:>11.3e} {:>12.9f}  {}\n", c.version,
                       c.max_rel, c.mean_rel, c.max_abs, c.pcc, c.pass ? "PASS" : "FAIL");
  }
  std::map<std::string, std::pair<int, int>> per_version;  // family/version -> passed, run
  std::vector<std::string> order;
  for (const Check& c : checks) {
    const std::string key = c.family + " " + c.version;
    if (!per_version.contains(key)) order.push_back(key);
    auto& [passed, run] = per_version[key];
    passed += c.pass ? 1 : 0;
    ++run;
  }
  out += "\n";
  for (const std::string& key : order) {
    const auto [passed, run] = per_version[key];
    out += fmt::format("{}: {} on {} of {} configurations\n", key, passed == run ? "PASS" : "FAIL",
                       passed, run);
  }
  const auto failed = std::ranges::count_if(checks, [](const Check& c) { return !c.pass; });
  out += failed == 0 ? fmt::format("all {} checks passed\n", checks.size())
                     : fmt::format("{} of {} checks FAILED\n", failed, checks.size());
  return out;
}

}  // namespace meshtest::kernels
