// reports/<name>/: the CSV, measurements.json, trace.json and the per-op plot.
#include "src/perf/report.hpp"

#include <cstdlib>

#include "src/core/error.hpp"
#include "src/core/file.hpp"
#include "src/perf/chrome_trace.hpp"
#include "src/perf/ops_csv.hpp"
#include "src/perf/plot.hpp"

namespace meshtest::perf {

namespace fs = std::filesystem;

fs::path reports_root() {
  const char* dir = std::getenv("MESHTEST_REPORTS_DIR");
  return dir && *dir ? fs::path(dir) : fs::path("reports");
}

void write_text_atomic(const fs::path& path, std::string_view text) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()),
                                         text.size());
  write_file_atomic(path, std::span(&bytes, 1));
}

ReportFiles write_report(std::span<const OpRecord> records, const ReportOptions& opts) {
  const std::string& name = opts.name;
  MESHTEST_CHECK(!name.empty() && name != "." && name != ".." &&
                     name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                            "0123456789_.-") == std::string::npos,
                 "report name must be non-empty letters, digits, '_', '.' or '-', got '{}'", name);
  ReportFiles f;
  f.aggregate = aggregate(records, opts.aggregate);
  f.dir = (opts.root.empty() ? reports_root() : opts.root) / name;
  std::error_code ec;
  fs::create_directories(f.dir, ec);
  MESHTEST_CHECK(!ec, "cannot create report directory '{}': {}", f.dir.string(), ec.message());
  f.csv = f.dir / fmt::format("ops_perf_{}.csv", name);
  f.measurements = f.dir / "measurements.json";
  f.trace = f.dir / "trace.json";
  write_text_atomic(f.csv, ops_csv(records));
  write_text_atomic(f.measurements, measurements_json(name, f.aggregate, opts.e2e));
  write_text_atomic(f.trace, chrome_trace_json(records));
  if (!opts.plot) return f;
  if (find_gnuplot().empty()) {
    f.plot_note = "gnuplot not found on PATH (install gnuplot-nox): ops.png not drawn";
    return f;
  }
  f.plot = f.dir / "ops.png";
  plot_op_durations(f.aggregate, f.plot, name);
  return f;
}

}  // namespace meshtest::perf
