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

#include "bench/moe_schemes.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/expert_parallel.hpp"
#include "src/models/gpt_oss_config.hpp"

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
  std::string device = "cpu";  ///< "cpu", or "cuda": the tables on GPU ranks
  std::string dtype = "f32";   ///< the GPU tables' dtype: bf16 or f32 (the CPU tables are f32)
  std::int64_t decode = 64;    ///< --device cuda: the decode batch of tables (b) and (c)
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

/// The EP problem of tables (b) and (c): this device's tokens and EP weights (f32), every EP
/// device's traffic.
struct EpProblem {
  std::int64_t tokens = 0;  ///< T, the tokens of the whole EP group
  dist::EpOptions o;
  GptOssConfig c;
  MoeParams p;
  dist::WeightSource src;
  ExpertPlacement placement;
  dist::EpMlpWeights w;
  Range mine;  ///< this device's tokens (the array_split share on the EP axis)
  Tensor x;    ///< [mine.size, hidden]
  std::vector<DeviceTraffic> traffic;  ///< per EP device
};

/// Rows r of the tokens x [tokens, o.hidden] (normal; element i depends only on the seed and i).
Tensor ep_tokens(const MoeBenchOptions& o, std::int64_t tokens, Range r);

/// The EP problem of `tokens` tokens at o's widths, experts and seed on `mesh` (EP on
/// o.ep_axis, contiguous placement), its traffic for the routing ep_mlp_block computes on the
/// host. Collective over the whole mesh.
EpProblem make_ep_problem(const dist::MeshDevice& mesh, const MoeBenchOptions& o,
                          std::int64_t tokens);

/// Every EP device's traffic for the local routing r (its expert ids all_gathered on the EP
/// axis). Collective over the whole mesh.
std::vector<DeviceTraffic> ep_traffic_of(const dist::MeshDevice& mesh, const Routing& r,
                                         const ExpertPlacement& placement, int ep_axis);

/// Tables (b) and (c) as o.parts asks, on `mesh` with EP on o.ep_axis (contiguous placement);
/// printed by device 0, their rows added to `doc`, the verdicts and the failed output checks
/// (the EP block against the other layouts, max |diff| <= 1e-4 · max |out|) to `v`.
/// Collective over the whole mesh.
void ep_tables(const dist::MeshDevice& mesh, const MoeBenchOptions& o, nlohmann::json& doc,
               Verdicts& v);

/// Tables (b) and (c) on GPU ranks (moe_ep_cuda.cpp), o.dtype, for the prefill of o.tokens and a
/// decode batch of o.decode tokens: (b) the EP dispatch + combine (all_to_all_v of device
/// tensors) against NCCL's own all_to_all (ncclSend/ncclRecv) of the same rows, the minimum
/// bytes and all_gather-everything; (c) the EP block (dist/gpu/parallel/ep_moe.hpp) against the
/// TP block (EP size 1, the units over every device), and its compute (the block less its
/// dispatch and combine) against the sum of its grouped GEMMs. Adds the verdicts; returns false
/// (printing why on rank 0) where the ranks have no GPUs of their own. Collective.
bool ep_tables_cuda(const dist::MeshDevice& mesh, const MoeBenchOptions& o, nlohmann::json& doc,
                    Verdicts& v);

}  // namespace meshtest::bench
