// reports/<name>/: ops_perf_<name>.csv, measurements.json, trace.json and ops.png, each
// written atomically.
#pragma once

#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "src/perf/aggregate.hpp"
#include "src/perf/measurements.hpp"

namespace meshtest::perf {

/// The reports directory: env MESHTEST_REPORTS_DIR, else "reports" (relative to the cwd).
std::filesystem::path reports_root();

/// Writes `text` to `path` through a temp file and a rename (write_file_atomic).
void write_text_atomic(const std::filesystem::path& path, std::string_view text);

struct ReportOptions {
  std::string name;                 ///< [A-Za-z0-9_.-]+, not "." or ".."
  std::filesystem::path root = {};  ///< empty: reports_root()
  AggregateOptions aggregate = {};
  std::optional<E2eStats> e2e = std::nullopt;
  bool plot = true;  ///< draw ops.png with gnuplot (skipped with a note when it is missing)
};

struct ReportFiles {
  std::filesystem::path dir, csv, measurements, trace;
  std::filesystem::path plot;  ///< empty when not drawn
  std::string plot_note;       ///< why the plot was not drawn
  Aggregate aggregate;
};

/// Aggregates `records` (all devices' records, e.g. from dist::gather_records) and writes
/// <root>/<name>/ops_perf_<name>.csv, measurements.json, trace.json and ops.png. Throws Error
/// for a bad name and as aggregate() does, before writing anything.
ReportFiles write_report(std::span<const OpRecord> records, const ReportOptions& opts);

}  // namespace meshtest::perf
