// Perf expectations: a measurements.json held against expected per-op device times and totals
// with a margin (meshtest-report check-perf; docs/perf.md, "Perf expectations").
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshtest::perf {

/// One op of a measurements.json (or of an expectations file, which has the same form).
struct OpTime {
  int index = 0;
  std::string op_code;
  std::string attributes;
  double kernel_duration_us = 0;
};

/// The figures of a measurements.json that perf is checked on. An expectations file is a
/// measurements.json (an earlier run's, taken as the baseline, or one written by --update),
/// optionally with a "margin" (the relative slack its author chose; the command line wins).
struct PerfFigures {
  std::string name;
  std::vector<OpTime> ops;
  double total_kernel_duration_us = 0;
  std::optional<double> total_op_to_op_latency_us;
  std::optional<double> e2e_mean_us;
  std::optional<double> margin;
};

/// Parses the JSON text of a measurements.json; `where` names it in errors. Throws Error
/// naming the file and the missing or invalid field (times must be finite and >= 0; op
/// indices 0, 1, ... in order; a margin finite and in [0, 10]).
PerfFigures parse_perf_figures(std::string_view json_text, std::string_view where);
/// parse_perf_figures of the file at `path`; an Error names a file that cannot be read.
PerfFigures read_perf_figures(const std::filesystem::path& path);

/// An expectations file made from a measurements.json's text: the same figures, with "margin"
/// set to `margin` (left as it is when nullopt). Throws Error as parse_perf_figures does for
/// text that is no measurements.json, and for a margin outside [0, 10].
std::string expectation_json(std::string_view measured_text, std::optional<double> margin,
                             std::string_view where);

/// The verdict of one row: within the margin, slower than it (a regression), faster than it
/// (an improvement: worth --update, never a failure).
enum class PerfVerdict { ok, regression, faster };

struct PerfRow {
  std::string what;  ///< "3 rms_norm" or "total kernel"
  double expected_us = 0, measured_us = 0;
  double ratio = 0;  ///< measured / expected (1 when both are 0, +inf when only expected is 0)
  PerfVerdict verdict = PerfVerdict::ok;
};

struct PerfCheckOptions {
  double margin = 0.1;  ///< a row regresses when measured > expected * (1 + margin)
  double min_us = 0.0;  ///< and measured - expected > min_us (timer noise of tiny ops)
  /// Whether the total op-to-op latency is held too: the host's gaps between calls, which on a
  /// busy machine are its scheduler's more than the ops'.
  bool op_to_op = true;
};

struct PerfCheck {
  std::vector<PerfRow> rows;  ///< every op, then the totals both files have
  bool regressed = false;
  /// The table (op, expected, measured, ratio, verdict) and a closing line.
  std::string table(const PerfCheckOptions& opt) const;
};

/// Holds `measured` against `expected`, op by op (matched by index: the op codes must agree,
/// else Error naming the first op that differs, as must the number of ops), then the totals:
/// kernel duration, op-to-op latency (unless opt.op_to_op is false) and the e2e mean where both
/// have them.
PerfCheck check_perf(const PerfFigures& expected, const PerfFigures& measured,
                     const PerfCheckOptions& opt);

}  // namespace meshtest::perf
