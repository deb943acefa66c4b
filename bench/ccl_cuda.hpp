// meshtest-bench ccl --device cuda's table: a row per size with meshtest's exact path, its NCCL
// path and the direct NCCL call side by side, the targets and the rows as JSON
// (ccl_cuda_report.cpp); ccl_cuda.cpp measures them.
#pragma once

#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "bench/ccl_bench.hpp"

namespace meshtest::bench::ccl {

/// What is timed per size, in the order of its windows: meshtest's default (exact) path, its
/// NCCL path (reductions only) and the direct NCCL call.
enum Side : std::size_t { kExact, kNcclPath, kDirect, kSides };

/// One side's best window and check.
struct Result {
  bool run = false;
  double seconds = std::numeric_limits<double>::infinity();  ///< per call, the slowest rank's
  std::int64_t wrong = -1;  ///< elements that differ, summed over ranks; -1: not checked
};

/// One table row: one size of one op.
struct GpuRow {
  CclOp op;
  std::int64_t bytes = 0, count = 0;
  double bus_factor = 0;
  std::array<Result, kSides> side{};
  double algbw(Side s) const { return static_cast<double>(bytes) / side[s].seconds / 1e9; }
  double busbw(Side s) const { return algbw(s) * bus_factor; }
  /// busbw / the direct NCCL call's busbw (same bytes, same factor) = its time / this time.
  double ratio(Side s) const { return side[kDirect].seconds / side[s].seconds; }
};

/// Collective over comm: "rank 0 cuda:0, rank 1 cuda:1 (NVIDIA H100 80GB HBM3); NCCL 2.28.3, CUDA
/// runtime 13.0, driver 13.0; NCCL_NVLS_ENABLE=0" on rank 0 ("" elsewhere); `gpu`: this rank's.
std::string describe_gpus(MPI_Comm comm, int gpu);
/// The table's title and column heads for `op` at p ranks; `nccl` names the direct call;
/// `order_free`: whether the NCCL-numerics sides are checked bit for bit.
void print_gpu_header(const Options& o, CclOp op, std::string_view nccl, int p, bool order_free);
/// One table row.
void print_gpu_row(const GpuRow& r, DType t);
/// The targets of the op's rows: the default path of a copy and the NCCL path of a reduction at
/// >= 0.95 x the direct call's busbw from 1 MiB (and the extra time per call below), the
/// default path of a reduction at >= 0.8 x from 64 MiB.
void print_gpu_targets(const std::vector<GpuRow>& rows, bool reduces);
/// The row as a JSON object (for --json).
nlohmann::json to_json(const GpuRow& r, const Options& o, int p);

}  // namespace meshtest::bench::ccl
