// meshtest-bench ccl's shared pieces: the ops it measures, its options, the layout of one size,
// a table row, the table and α-β model printing (ccl_report.cpp), and the GPU table's entry
// (ccl_cuda.cpp). Names, bus factors, inputs and the exact expected outputs come from the table
// of dist/ccl/cases.hpp.
#pragma once

#include <mpi.h>

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

/// Where the CCLs run: host tensors against MPI, or each rank's GPU against NCCL.
enum class Device { cpu, cuda };

struct Options {
  Device device = Device::cpu;
  std::int64_t min_bytes = 0, max_bytes = 0;
  double factor = 2;
  int iters = 20, warmup = 5, check = 1, dim = 0, rows = 64, rounds = 3;
  DType dtype = DType::f32;
  ReduceOp redop = ReduceOp::sum;
  std::vector<CclOp> ops;
  std::string json;
  /// --memory arena: the inputs lie in the node arena (dist/ccl/arena), read in place.
  bool arena = false;
};

/// The layout of one size: every tensor is [rows, cols] (1-D [cols] along dim 0); the op
/// splits or concatenates the last dim, whose local block has `block` columns.
struct Layout {
  std::int64_t rows = 1, cols = 0, block = 0;  // cols: of the whole (gathered / reduced) tensor
  Shape shape(std::int64_t c) const { return rows == 1 ? Shape{c} : Shape{rows, c}; }
};

/// The layout of `op` at about `bytes` (the whole tensor: all_reduce's vector, all_gather's
/// output, reduce_scatter's input, all_to_all's send buffer) on p devices: rows * cols elements,
/// rounded down to a multiple of the rows and, but for all_reduce, of p (at least one such unit).
Layout layout_of(CclOp op, std::int64_t bytes, const Options& o, int p);

/// The sizes of the table's rows: -b, then times -f up to -e (-b alone when they are equal).
std::vector<std::int64_t> sizes_of(const Options& o);

/// The case table's call of `op` at layout l on the line's p devices, along the last dim: every
/// input is [rows, cols], all_gather's [rows, block].
dist::CclCall call_of(const Layout& l, CclOp op, const Options& o, int p);

/// Collective: "8 on 1 node (host)" or "4 on 2 nodes: h1 x2 (ranks 0 2), h2 x2 (ranks 1 3)":
/// where the ranks run, by MPI_Get_processor_name, for the table's header ("" but on rank 0).
std::string describe_nodes(MPI_Comm comm);

/// meshtest-bench ccl --device cuda after MPI_Init (ccl_cuda.cpp, built with the GPU side only):
/// the GPU table on every rank's GPU. Collective over MPI_COMM_WORLD; returns the exit code (2
/// with the reason when a rank has no GPU of its own).
int run_cuda(const Options& o);

/// One table row.
struct Row {
  CclOp op;
  std::int64_t bytes = 0, count = 0, wrong = 0;
  double time_us = 0, algbw = 0, busbw = 0, mpi_time_us = 0, mpi_busbw = 0, ratio = 0;
  /// Per call and device, from the shared-memory path's own accounting (dist::path_reports;
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
/// The op's busbw beside memcpy of the same bytes (gbps[i] for rows[i]), with each device's
/// bytes written into the window and read from the others.
void print_memcpy(CclOp op, const std::vector<Row>& rows, const std::vector<double>& gbps);
/// The row as a JSON object (for --json).
nlohmann::json to_json(const Row& r, const Options& o, int p);
/// Writes the rows to `path` (--json; rank 0) and says so.
void write_json(const std::string& path, const nlohmann::json& rows);

}  // namespace meshtest::bench::ccl
