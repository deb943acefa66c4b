// Plots drawn by gnuplot (the Debian package gnuplot-nox, run as a program): per-op durations
// and CCL bus bandwidth against message size.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "src/perf/aggregate.hpp"

namespace meshtest::perf {

/// The gnuplot executable found on PATH, or an empty path.
std::filesystem::path find_gnuplot();

/// Throws Error "gnuplot not found ..." (naming the Debian package) when find_gnuplot fails.
std::filesystem::path require_gnuplot();

/// Bars of each op's average kernel duration and op-to-op latency (µs) of an aggregated
/// report, one cluster per op position. Writes `png` atomically. Throws Error when gnuplot is
/// missing or fails, or when there are no ops.
void plot_op_durations(const Aggregate& a, const std::filesystem::path& png,
                       std::string_view title);

/// One row of `meshtest-bench ccl --json FILE`.
struct CclBenchRow {
  std::string op;  ///< all_reduce, all_gather, reduce_scatter, all_to_all
  std::int64_t bytes = 0;
  std::string dtype;
  int np = 0;
  double time_us = 0, algbw = 0, busbw = 0;
  std::int64_t wrong = 0;
  double mpi_time_us = 0, mpi_busbw = 0, ratio = 0;
  int dim = 0;  ///< optional field: the tensor dim the CCL works along (0 when absent)
};

/// Parses the bench JSON: a top-level array of row objects, an object whose "rows" is that
/// array, or JSON lines (one object per line). Throws Error naming the row and field when a
/// field is missing or of the wrong type, or when there are no rows.
std::vector<CclBenchRow> parse_ccl_bench_json(std::string_view text, std::string_view source);

/// busbw (GB/s) against bytes (log scale) for each op (and np, dtype): meshtest solid, direct
/// MPI dashed. Writes `png` atomically; throws like plot_op_durations.
void plot_ccl_busbw(const std::vector<CclBenchRow>& rows, const std::filesystem::path& png,
                    std::string_view title);

}  // namespace meshtest::perf
