// meshtest-bench ccl's shared pieces: the ops it measures, its options, a table row, the
// crafted exact data and its check (ccl_check.cpp), and the table and α-β model printing
// (ccl_report.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "dist/ccl/ccl.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::bench::ccl {

using dist::ReduceOp;

enum class Op { all_reduce, all_gather, reduce_scatter, all_to_all };
constexpr Op kOps[] = {Op::all_reduce, Op::all_gather, Op::reduce_scatter, Op::all_to_all};

/// What the bench needs to know of one CCL: names, bandwidth factor, α-β regressors.
struct OpInfo {
  std::string_view name, mpi_name;
  double (*bus_factor)(int);
  int ring_passes;  ///< ring all_reduce = reduce_scatter + all_gather: 2 passes; others 1
};

inline OpInfo info(Op op) {
  switch (op) {
    case Op::all_reduce:
      return {"all_reduce", "MPI_Allreduce", &dist::all_reduce_bw::bus_factor, 2};
    case Op::all_gather:
      return {"all_gather", "MPI_Allgather", &dist::all_gather_bw::bus_factor, 1};
    case Op::reduce_scatter:
      return {"reduce_scatter", "MPI_Reduce_scatter_block", &dist::reduce_scatter_bw::bus_factor,
              1};
    case Op::all_to_all:
      return {"all_to_all", "MPI_Alltoall", &dist::all_to_all_bw::bus_factor, 1};
  }
  return {};
}

struct Options {
  std::int64_t min_bytes = 0, max_bytes = 0;
  double factor = 2;
  int iters = 20, warmup = 5, check = 1, dim = 0, rows = 64, rounds = 3;
  DType dtype = DType::f32;
  ReduceOp redop = ReduceOp::sum;
  std::vector<Op> ops;
  std::string json;
};

/// One table row.
struct Row {
  Op op;
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

/// The layout of one size: every tensor is [rows, cols] (1-D [cols] along dim 0); the op
/// splits or concatenates the last dim, whose local block has `block` columns.
struct Layout {
  std::int64_t rows = 1, cols = 0, block = 0;  // cols: of the whole (gathered / reduced) tensor
  Shape shape(std::int64_t c) const { return rows == 1 ? Shape{c} : Shape{rows, c}; }
};

/// Device `me`'s crafted input for `op` (integers times small factors: every reduction of
/// them is exact in every dtype, bf16 included).
Tensor make_input(const Layout& l, Op op, int me, DType t);
/// Elements of y (this device's output of `op` on make_input's data) that differ from the
/// exactly predicted result; every element when y's shape or dtype is wrong.
std::int64_t count_wrong(const Layout& l, Op op, const Options& o, int me, int p, const Tensor& y);

/// "64 KiB", "2 MiB", "512 B"
std::string human(double bytes);
/// The table's title and column heads for `op` at p ranks.
void print_header(const Options& o, Op op, int p);
/// One table row.
void print_row(const Row& r, DType t);
/// Fits t = α·steps + β·bus_factor(p)·S to the op's rows and prints the projection; steps
/// are the rows' counted steps (shared-memory path: they do not grow with p), else the ring's
/// passes·(p-1).
void print_model(Op op, int p, const std::vector<Row>& rows);
/// The row as a JSON object (for --json).
nlohmann::json to_json(const Row& r, const Options& o, int p);

}  // namespace meshtest::bench::ccl
