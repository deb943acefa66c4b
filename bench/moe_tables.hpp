// moe_tables: the measurements and tables of meshtest-bench moe (bench/bench_moe.cpp parses the
// options): (a) grouped GEMM against dense GEMM, (b) EP dispatch + combine against the minimum
// and all_gather-everything, (c) the EP MLP block against the all_gather and TP blocks.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "dist/mesh/mesh_device.hpp"

namespace meshtest::bench {

/// One grouped GEMM problem of table (a): [rows, in] -> [rows, out] over `experts` matrices.
struct GemmSize {
  std::int64_t rows = 0, in = 0, out = 0, experts = 0;
};

/// The options of meshtest-bench moe (checked by its parser).
struct MoeBenchOptions {
  std::array<int, 2> mesh{1, 1};
  int ep_axis = 0;  ///< experts (and tokens) on this axis, TP on the other
  std::int64_t hidden = 2880, intermediate = 2880, experts = 32, k = 4, tokens = 1024;
  std::vector<GemmSize> gemms;
  std::set<std::string> parts;  ///< "gemm", "exchange", "block"
  int iters = 3, warmup = 1;
  std::uint64_t seed = 1;
  std::string device = "cpu";  ///< "cpu", or "cuda": table (a) on rank 0's GPU
  std::string dtype = "f32";   ///< the GPU table's dtype: bf16 or f32 (the CPU tables are f32)
};

/// The targets met or missed (one line each, rank 0's) and the failed correctness checks (the
/// same on every rank).
struct Verdicts {
  std::vector<std::string> lines;
  int failed = 0;
};

/// Prints (rank 0) what is measured and returns it as the JSON document's head. Local.
nlohmann::json moe_header(const dist::MeshDevice& mesh, const MoeBenchOptions& o);

/// Table (a), measured and printed by the calling process alone: for each size and for
/// uniform, Zipf (share of expert e ∝ 1/(e+1)) and all-to-one routing, grouped_gemm against one
/// dense Eigen GEMM [rows, in] x [out, in]ᵀ (median of o.iters after o.warmup, interleaved).
/// Adds the >= 0.8x verdict. Returns the rows as JSON.
nlohmann::json gemm_table(const MoeBenchOptions& o, Verdicts& v);

/// Segment offsets [E + 1] of `rows` rows: "uniform" (array_split), "zipf" (expert e's share
/// ∝ 1/(e+1), the rounding remainder to the lowest ids) or "all-to-one" (every row on expert 0).
std::vector<std::int64_t> segment_offsets(const std::string& routing, std::int64_t rows,
                                          std::int64_t experts);

/// The experts with rows and the largest segment of offsets [E + 1].
struct SegmentUse {
  std::int64_t used = 0, largest = 0;
};
SegmentUse segment_use(const std::vector<std::int64_t>& offsets);

/// One row of table (a) as JSON: the size, the routing, its use, both times (ms), both
/// GFLOP/s and the ratio.
nlohmann::json gemm_row(const GemmSize& g, const std::string& routing, SegmentUse use,
                        double grouped_ms, double dense_ms, double ratio);

/// Table (a)'s tally: rows that meet the target, and the ones that miss it, named.
struct GemmTally {
  int meets = 0, total = 0;
  std::string misses;
  /// Counts one row; returns ok.
  bool add(const GemmSize& g, const std::string& routing, double ratio, bool ok);
};

/// Table (a) on the calling process's current GPU (builds with the GPU side: moe_cuda.cpp): for
/// each size and routing, gpu::grouped_gemm (o.dtype) against one dense cuBLASLt GEMM of the
/// same FLOPs, each timed by CUDA events on the Blas's stream (median of o.iters after
/// o.warmup, interleaved). Adds the verdict: grouped time <= 1.25 x dense. Returns the rows.
nlohmann::json gemm_table_cuda(const MoeBenchOptions& o, Verdicts& v);

/// Tables (b) and (c) as o.parts asks, on `mesh` with EP on o.ep_axis (contiguous placement);
/// printed by device 0, their rows added to `doc`, the verdicts and the failed output checks
/// (the EP block against the other layouts, max |diff| <= 1e-4 · max |out|) to `v`.
/// Collective over the whole mesh.
void ep_tables(const dist::MeshDevice& mesh, const MoeBenchOptions& o, nlohmann::json& doc,
               Verdicts& v);

}  // namespace meshtest::bench
