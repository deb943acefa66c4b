// Config comparison of ops_perf reports: unique contiguous match, then field by field.
#include "src/perf/compare.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "src/core/error.hpp"
#include "src/perf/aggregate.hpp"

namespace meshtest::perf {

namespace {

/// Record indices of the first measured iteration of the lowest device id.
std::vector<std::size_t> first_iteration(const OpsReport& r, int iterations) {
  return measured_region(r.records, {.iterations = iterations}).ops[0][0];
}

std::string where(const OpsReport& r, std::size_t idx) {
  return fmt::format("{} line {}", r.source, r.lines[idx]);
}

/// Field-by-field differences of two records: ATTRIBUTES (when `attributes`) and the
/// INPUT_/OUTPUT_ fields (only the shape dims when `shapes_only`).
std::vector<std::pair<std::string, std::pair<std::string, std::string>>> field_diffs(
    const OpRecord& a, const OpRecord& b, bool attributes, bool shapes_only) {
  std::vector<std::pair<std::string, std::pair<std::string, std::string>>> out;
  if (attributes && a.attributes != b.attributes) {
    out.push_back({"ATTRIBUTES", {a.attributes, b.attributes}});
  }
  std::map<std::string, std::pair<std::string, std::string>> fields;
  for (const auto& [k, v] : tensor_fields(a)) fields[k].first = v;
  for (const auto& [k, v] : tensor_fields(b)) fields[k].second = v;
  // Keep the CSV's column order: inputs before outputs, then by index and W, Z, Y, X, ...
  std::vector<std::string> order;
  for (const auto& [k, v] : tensor_fields(a.inputs.size() >= b.inputs.size() ? a : b)) {
    if (k.starts_with("INPUT")) order.push_back(k);
  }
  for (const auto& [k, v] : tensor_fields(a.outputs.size() >= b.outputs.size() ? a : b)) {
    if (k.starts_with("OUTPUT")) order.push_back(k);
  }
  for (const std::string& k : order) {
    const bool dim =
        k.ends_with("_W") || k.ends_with("_Z") || k.ends_with("_Y") || k.ends_with("_X");
    if (shapes_only && !dim) continue;
    const auto& [x, y] = fields[k];
    if (x != y) out.push_back({k, {x.empty() ? "(none)" : x, y.empty() ? "(none)" : y}});
  }
  return out;
}

std::string codes(const OpsReport& r, const std::vector<std::size_t>& idx) {
  std::vector<std::string> c;
  for (std::size_t i : idx) c.push_back(r.records[i].op_code);
  return fmt::format("{}", fmt::join(c, ", "));
}

std::string ops(std::size_t n) { return fmt::format("{} op{}", n, n == 1 ? "" : "s"); }

std::string mismatches(std::size_t n) {
  return fmt::format("{} mismatch{}", n, n == 1 ? "" : "es");
}

}  // namespace

CompareResult compare_configs(const OpsReport& unit, const OpsReport& module,
                              const CompareOptions& opts) {
  const auto u = first_iteration(unit, opts.unit_iterations);
  const auto m = first_iteration(module, opts.module_iterations);
  std::vector<std::size_t> starts;
  for (std::size_t s = 0; s + u.size() <= m.size(); ++s) {
    bool same = true;
    for (std::size_t k = 0; k < u.size() && same; ++k) {
      same = unit.records[u[k]].op_code == module.records[m[s + k]].op_code;
    }
    if (same) starts.push_back(s);
  }
  CompareResult res;
  if (starts.empty()) {
    res.problems.push_back(fmt::format(
        "no matching subsequence: the unit test's {} ({}) do not occur contiguously in the "
        "module's {} ({}){}",
        ops(u.size()), codes(unit, u), ops(m.size()), codes(module, m),
        opts.unit_iterations == 0
            ? " (if the unit report wraps several iterations in one start/stop signpost pair, "
              "pass --unit-iterations N)"
            : ""));
    res.summary = "FAIL: no matching subsequence";
    return res;
  }
  if (starts.size() > 1) {
    std::vector<std::string> at;
    for (std::size_t s : starts) at.push_back(where(module, m[s]));
    res.problems.push_back(fmt::format(
        "ambiguous: the unit test's {} ({}) occur {} times in the module, starting at {}",
        ops(u.size()), codes(unit, u), starts.size(), fmt::join(at, "; ")));
    res.summary = "FAIL: ambiguous match";
    return res;
  }
  const std::size_t s = starts[0];
  for (std::size_t k = 0; k < u.size(); ++k) {
    const OpRecord& a = unit.records[u[k]];
    const OpRecord& b = module.records[m[s + k]];
    for (const auto& [field, v] : field_diffs(a, b, true, false)) {
      res.problems.push_back(fmt::format("op {} '{}' ({} / {}): {}: unit '{}', module '{}'", k,
                                         a.op_code, where(unit, u[k]), where(module, m[s + k]),
                                         field, v.first, v.second));
    }
  }
  res.ok = res.problems.empty();
  res.summary = fmt::format("{}: the unit test's {} ops match module ops {}..{} ({} .. {}); {}",
                            res.ok ? "OK" : "FAIL", u.size(), s, s + u.size() - 1,
                            where(module, m[s]), where(module, m[s + u.size() - 1]),
                            res.ok ? "op code, attributes and every INPUT_/OUTPUT_ field equal"
                                   : mismatches(res.problems.size()));
  return res;
}

CompareResult compare_shapes(const OpsReport& single, const OpsReport& multi,
                             const CompareOptions& opts) {
  const Region one = measured_region(single.records, {.iterations = opts.unit_iterations});
  MESHTEST_CHECK(one.device_ids.size() == 1,
                 "{}: a single-device report must hold 1 device, it holds {} (device ids {})",
                 single.source, one.device_ids.size(), fmt::join(one.device_ids, ", "));
  const auto a = one.ops[0][0];
  const auto b = first_iteration(multi, opts.module_iterations);
  CompareResult res;
  if (a.size() != b.size()) {
    res.problems.push_back(
        fmt::format("op counts differ: single-device run {} ({}), multi-device device 0 {} ({})",
                    ops(a.size()), codes(single, a), ops(b.size()), codes(multi, b)));
  }
  for (std::size_t k = 0; k < std::min(a.size(), b.size()); ++k) {
    const OpRecord& x = single.records[a[k]];
    const OpRecord& y = multi.records[b[k]];
    if (x.op_code != y.op_code) {
      res.problems.push_back(fmt::format("op {} ({} / {}): OP CODE: single '{}', multi '{}'", k,
                                         where(single, a[k]), where(multi, b[k]), x.op_code,
                                         y.op_code));
      continue;
    }
    for (const auto& [field, v] : field_diffs(x, y, false, true)) {
      res.problems.push_back(fmt::format("op {} '{}' ({} / {}): {}: single {}, multi {}", k,
                                         x.op_code, where(single, a[k]), where(multi, b[k]), field,
                                         v.first, v.second));
    }
  }
  res.ok = res.problems.empty();
  res.summary = res.ok ? fmt::format("OK: {} ops, every input and output shape equal", a.size())
                       : "FAIL: " + mismatches(res.problems.size());
  return res;
}

}  // namespace meshtest::perf
