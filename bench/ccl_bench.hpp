// meshtest-bench ccl's shared pieces: the ops it measures, its options, a table row, and the
// table and α-β model printing (ccl_report.cpp). Names, bus factors, inputs and the exact
// expected outputs come from the table of dist/ccl/cases.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "dist/ccl/cases.hpp"
#include "dist/ccl/ccl.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::bench::ccl {

using dist::CclOp;
using dist::ReduceOp;

/// The CCLs the bench measures, in the order of --op all.
constexpr CclOp kOps[] = {CclOp::all_reduce, CclOp::all_gather, CclOp::reduce_scatter,
                          CclOp::all_to_all};

struct Options {
  std::int64_t min_bytes = 0, max_bytes = 0;
  double factor = 2;
  int iters = 20, warmup = 5, check = 1, dim = 0, rows = 64, rounds = 3;
  DType dtype = DType::f32;
  ReduceOp redop = ReduceOp::sum;
  std::vector<CclOp> ops;
  std::string json;
};

/// One table row.
struct Row {
  CclOp op;
  std::int64_t bytes = 0, count = 0, wrong = 0;
  double time_us = 0, algbw = 0, busbw = 0, mpi_time_us = 0, mpi_busbw = 0, ratio = 0;
  /// Per call and device, from the shared-memory path's own accounting (ShmGroup::traffic;
  /// counted = false on the MPI path, whose algorithm MPI picks): steps (the agreement
  /// included), bytes written into the window and bytes read from other devices' slots.
  bool counted = false;
  double steps = 0, written = 0, read = 0;
  /// The ring minimum each way per device: bus_factor(p) * S (2(p-1)/p·S for all_reduce).
  double ring_min = 0;
  double touched() const { return ring_min > 0 ? std::max(written, read) / ring_min : 0; }
};

/// "64 KiB", "2 MiB", "512 B"
std::string human(double bytes);
/// The table's title and column heads for `op` at p ranks.
void print_header(const Options& o, CclOp op, int p);
/// One table row.
void print_row(const Row& r, DType t);
/// Fits t = α·steps + β·bus_factor(p)·S to the op's rows and prints the projection; steps
/// are the rows' counted steps (shared-memory path: they do not grow with p), else the ring's
/// passes·(p-1).
void print_model(CclOp op, int p, const std::vector<Row>& rows);
/// The row as a JSON object (for --json).
nlohmann::json to_json(const Row& r, const Options& o, int p);

}  // namespace meshtest::bench::ccl
