// Perf expectations: parse two measurements.json and compare them row by row.
#include "src/perf/perf_check.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "src/core/error.hpp"
#include "src/core/file.hpp"

namespace meshtest::perf {
namespace {

using nlohmann::json;

double time_field(const json& j, const char* key, std::string_view where, std::string_view in) {
  MESHTEST_CHECK(j.contains(key), "{}: {} has no \"{}\"", where, in, key);
  MESHTEST_CHECK(j.at(key).is_number(), "{}: {}'s \"{}\" is {}, not a number", where, in, key,
                 j.at(key).dump());
  const double v = j.at(key).get<double>();
  MESHTEST_CHECK(std::isfinite(v) && v >= 0,
                 "{}: {}'s \"{}\" is {}: a time must be finite and >= 0", where, in, key, v);
  return v;
}

std::optional<double> optional_time(const json& j, const char* key, std::string_view where,
                                    std::string_view in) {
  if (!j.contains(key)) return std::nullopt;
  return time_field(j, key, where, in);
}

PerfRow row(std::string what, double expected, double measured, const PerfCheckOptions& opt) {
  PerfRow r{.what = std::move(what), .expected_us = expected, .measured_us = measured};
  r.ratio = expected > 0    ? measured / expected
            : measured == 0 ? 1.0
                            : std::numeric_limits<double>::infinity();
  const double slack = opt.margin * expected;
  if (measured > expected + slack && measured - expected > opt.min_us) {
    r.verdict = PerfVerdict::regression;
  } else if (measured < expected - slack && expected - measured > opt.min_us) {
    r.verdict = PerfVerdict::faster;
  }
  return r;
}

std::string_view verdict_name(PerfVerdict v) {
  switch (v) {
    case PerfVerdict::ok:
      return "ok";
    case PerfVerdict::regression:
      return "REGRESSION";
    case PerfVerdict::faster:
      return "faster";
  }
  return "?";
}

}  // namespace

PerfFigures parse_perf_figures(std::string_view json_text, std::string_view where) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    fail("{}: not JSON: {}", where, e.what());
  }
  MESHTEST_CHECK(j.is_object(), "{}: expected a measurements.json object, got a JSON {}", where,
                 j.type_name());
  PerfFigures f;
  if (j.contains("name") && j.at("name").is_string()) f.name = j.at("name").get<std::string>();
  MESHTEST_CHECK(j.contains("ops") && j.at("ops").is_array(),
                 "{}: no \"ops\" array (is it a measurements.json?)", where);
  for (const json& op : j.at("ops")) {
    const std::string in = fmt::format("op {}", f.ops.size());
    MESHTEST_CHECK(op.is_object() && op.contains("op_code") && op.at("op_code").is_string(),
                   "{}: {} has no \"op_code\" string", where, in);
    OpTime t;
    t.index = static_cast<int>(f.ops.size());
    MESHTEST_CHECK(!op.contains("index") || op.at("index") == t.index,
                   "{}: {} has index {}; the ops must be listed in order 0, 1, ...", where, in,
                   op.contains("index") ? op.at("index").dump() : "");
    t.op_code = op.at("op_code").get<std::string>();
    if (op.contains("attributes") && op.at("attributes").is_string()) {
      t.attributes = op.at("attributes").get<std::string>();
    }
    t.kernel_duration_us = time_field(op, "kernel_duration_us", where, in);
    f.ops.push_back(std::move(t));
  }
  f.total_kernel_duration_us = time_field(j, "total_kernel_duration_us", where, "the report");
  f.total_op_to_op_latency_us = optional_time(j, "total_op_to_op_latency_us", where, "the report");
  if (j.contains("e2e")) f.e2e_mean_us = optional_time(j.at("e2e"), "mean_us", where, "\"e2e\"");
  if (j.contains("margin")) {
    MESHTEST_CHECK(j.at("margin").is_number(), "{}: \"margin\" is {}, not a number", where,
                   j.at("margin").dump());
    const double m = j.at("margin").get<double>();
    MESHTEST_CHECK(std::isfinite(m) && m >= 0 && m <= 10,
                   "{}: \"margin\" is {}: expected a fraction in [0, 10] (0.1 = 10 %)", where, m);
    f.margin = m;
  }
  return f;
}

PerfFigures read_perf_figures(const std::filesystem::path& path) {
  return parse_perf_figures(read_text_file(path), path.string());
}

std::string expectation_json(std::string_view measured_text, std::optional<double> margin,
                             std::string_view where) {
  parse_perf_figures(measured_text, where);  // a measurements.json, or an Error naming it
  json j = json::parse(measured_text);
  if (margin) {
    MESHTEST_CHECK(std::isfinite(*margin) && *margin >= 0 && *margin <= 10,
                   "{}: the margin {} must lie in [0, 10] (0.1 = 10 %)", where, *margin);
    j["margin"] = *margin;
  }
  return j.dump(2) + "\n";
}

PerfCheck check_perf(const PerfFigures& expected, const PerfFigures& measured,
                     const PerfCheckOptions& opt) {
  MESHTEST_CHECK(std::isfinite(opt.margin) && opt.margin >= 0,
                 "check-perf: the margin must be finite and >= 0, got {}", opt.margin);
  MESHTEST_CHECK(std::isfinite(opt.min_us) && opt.min_us >= 0,
                 "check-perf: --min-us must be finite and >= 0, got {}", opt.min_us);
  MESHTEST_CHECK(expected.ops.size() == measured.ops.size(),
                 "check-perf: the expectation has {} ops per iteration but the measurement {}: "
                 "not the same op sequence (update the expectation with --update)",
                 expected.ops.size(), measured.ops.size());
  PerfCheck c;
  for (std::size_t k = 0; k < expected.ops.size(); ++k) {
    const OpTime& e = expected.ops[k];
    const OpTime& m = measured.ops[k];
    MESHTEST_CHECK(e.op_code == m.op_code,
                   "check-perf: op {} is {} in the expectation but {} in the measurement: not "
                   "the same op sequence",
                   k, e.op_code, m.op_code);
    c.rows.push_back(
        row(fmt::format("{} {}", k, e.op_code), e.kernel_duration_us, m.kernel_duration_us, opt));
  }
  c.rows.push_back(row("total kernel", expected.total_kernel_duration_us,
                       measured.total_kernel_duration_us, opt));
  if (opt.op_to_op && expected.total_op_to_op_latency_us && measured.total_op_to_op_latency_us) {
    c.rows.push_back(row("total op-to-op", *expected.total_op_to_op_latency_us,
                         *measured.total_op_to_op_latency_us, opt));
  }
  if (expected.e2e_mean_us && measured.e2e_mean_us) {
    c.rows.push_back(row("e2e mean", *expected.e2e_mean_us, *measured.e2e_mean_us, opt));
  }
  for (const PerfRow& r : c.rows) c.regressed = c.regressed || r.verdict == PerfVerdict::regression;
  return c;
}

std::string PerfCheck::table(const PerfCheckOptions& opt) const {
  std::string out = fmt::format("{:<28} {:>14} {:>14} {:>8}  {}\n", "op", "expected us",
                                "measured us", "ratio", "verdict");
  int regressions = 0, faster = 0;
  for (const PerfRow& r : rows) {
    out += fmt::format("{:<28} {:>14.3f} {:>14.3f} {:>8.3f}  {}\n", r.what, r.expected_us,
                       r.measured_us, r.ratio, verdict_name(r.verdict));
    regressions += r.verdict == PerfVerdict::regression;
    faster += r.verdict == PerfVerdict::faster;
  }
  out += fmt::format(
      "{} of {} rows slower than expected by more than {:.0f} %{}; {} faster{}\n", regressions,
      rows.size(), opt.margin * 100,
      opt.min_us > 0 ? fmt::format(" and {} us", opt.min_us) : std::string(), faster,
      faster > 0 && regressions == 0 ? " (--update takes the new times as the expectation)" : "");
  return out;
}

}  // namespace meshtest::perf
