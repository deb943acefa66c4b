// meshtest-demo section: a tiny gpt-oss decoder layer on the mesh (TP on axis 1, tokens on
// axis 0) against a single-device run — PCC, then a per-op perf table from the profiler.
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "dist/mesh/mpi_check.hpp"
#include "dist/parallel/tensor_parallel.hpp"
#include "src/check/metrics.hpp"
#include "src/core/random.hpp"
#include "src/models/transformer_block.hpp"
#include "src/perf/profiler.hpp"
#include "tools/demo_sections.hpp"

namespace meshtest::dist {
namespace {

constexpr int kWarmup = 2;
constexpr int kIters = 10;
constexpr std::int64_t kTokens = 32;

/// One row of the perf table: an op position of the measured iterations.
struct OpRow {
  std::string op;
  perf::OpType type = perf::OpType::compute;
  std::string shape;
  double us = 0;  ///< per iteration: compute max over devices, CCL mean over devices
};

/// The records between the "start" and "stop" signposts, without the signposts.
std::vector<perf::OpRecord> measured(const std::vector<perf::OpRecord>& all) {
  std::vector<perf::OpRecord> out;
  bool in = false;
  for (const perf::OpRecord& r : all) {
    if (r.op_type == perf::OpType::signpost) {
      in = r.attributes == "start" ? true : (r.attributes == "stop" ? false : in);
    } else if (in) {
      out.push_back(r);
    }
  }
  return out;
}

/// Merges every device's durations (compute: max, ccl: mean) position by position, averages the
/// iterations; rows on rank 0. Returns false (on every rank) if the devices' sequences differ.
bool aggregate(const MeshDevice& mesh, const std::vector<perf::OpRecord>& recs,
               std::vector<OpRow>& rows) {
  int n = static_cast<int>(recs.size()), lo = 0, hi = 0;
  MESHTEST_MPI(MPI_Allreduce(&n, &lo, 1, MPI_INT, MPI_MIN, mesh.comm()));
  MESHTEST_MPI(MPI_Allreduce(&n, &hi, 1, MPI_INT, MPI_MAX, mesh.comm()));
  if (lo != hi || n % kIters != 0) return false;
  std::vector<double> mine(recs.size());
  for (std::size_t i = 0; i < recs.size(); ++i) mine[i] = recs[i].duration_ns() * 1e-3;
  std::vector<double> all(recs.size() * static_cast<std::size_t>(mesh.size()));
  MESHTEST_MPI(MPI_Gather(mine.data(), n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, 0, mesh.comm()));
  if (mesh.device_id() != 0) return true;
  const int per_iter = n / kIters;
  rows.resize(static_cast<std::size_t>(per_iter));
  for (int i = 0; i < n; ++i) {
    const perf::OpRecord& r = recs[static_cast<std::size_t>(i)];
    double merged = 0;
    for (int d = 0; d < mesh.size(); ++d) {
      const double v = all[static_cast<std::size_t>(d * n + i)];
      merged = r.op_type == perf::OpType::ccl ? merged + v / mesh.size() : std::max(merged, v);
    }
    OpRow& row = rows[static_cast<std::size_t>(i % per_iter)];
    row.op = r.op_code;
    row.type = r.op_type;
    row.shape = r.inputs.empty() ? "" : r.inputs[0].shape.str();
    row.us += merged / kIters;
  }
  return true;
}

}  // namespace

int demo_gpt_oss(const MeshDevice& mesh) {
  const bool root = mesh.device_id() == 0;
  const GptOssConfig c = GptOssConfig::tiny_tp();
  const TpOptions o{.tp_axis = 1};
  const int tp = mesh.axis_size(o.tp_axis);
  if (root) {
    fmt::print(
        "\ngpt-oss decoder layer (hidden {}, {} q / {} kv heads of {}, {} experts top-{}, "
        "intermediate {}, window {}), T = {} tokens, f32, random weights: TP = {} on axis 1, "
        "tokens split over {} on axis 0, against one device\n",
        c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.num_experts,
        c.experts_per_token, c.intermediate_size, c.sliding_window, kTokens, tp, mesh.axis_size(0));
  }
  if (c.num_key_value_heads % tp != 0 || c.intermediate_size % tp != 0) {
    if (root) fmt::print("skipped: TP = {} does not divide the heads and intermediate\n", tp);
    return 0;
  }
  const BlockWeights full = init_block_weights(c, 0, DType::f32, RandomInit{42});
  const BlockWeights shard = shard_block_weights(weight_source(full, 0), c, 0, tp_rank(mesh, o));
  const Tensor x = random_normal(Shape{kTokens, c.hidden_size}, DType::f32, {.seed = 43});
  const Placements act = tp_activation_placements(o);
  const Tensor local = distribute(x, mesh, act);

  perf::set_device_id(mesh.device_id());
  std::vector<perf::OpRecord> recs;
  Tensor y;
  {
    perf::Session session;
    for (int it = 0; it < kWarmup + kIters; ++it) {
      MESHTEST_MPI(MPI_Barrier(mesh.comm()));
      if (it == kWarmup) perf::signpost("start");
      y = tp_transformer_block(mesh, local, shard, c, 0, o);
    }
    perf::signpost("stop");
    recs = measured(perf::records());
  }
  const Tensor got = gather_full(y, mesh, act);
  int failed = 0;
  double value = 0;
  if (root) {
    value = pcc(transformer_block(x, full, c, 0), got);
    failed = value >= 0.99999 ? 0 : 1;
  }
  MESHTEST_MPI(MPI_Bcast(&failed, 1, MPI_INT, 0, mesh.comm()));
  std::vector<OpRow> rows;
  const bool same = aggregate(mesh, recs, rows);
  if (!root) return failed;
  fmt::print("transformer block, mesh {}: PCC {:.9f} (threshold 0.99999) {}\n\n", mesh.str(), value,
             failed == 0 ? "PASS" : "FAIL");
  if (!same) {
    fmt::print("per-op table skipped: the devices recorded different op sequences\n");
    return failed;
  }
  fmt::print("{:<19} {:<7} {:<16} {:>10} {:>7}\n", "op", "type", "input 0 (dev 0)", "us/iter",
             "share");
  double total = 0;
  for (const OpRow& r : rows) total += r.us;
  for (const OpRow& r : rows) {
    fmt::print("{:<19} {:<7} {:<16} {:>10.1f} {:>6.1f}%\n", r.op, perf::op_type_name(r.type),
               r.shape, r.us, total > 0 ? 100 * r.us / total : 0.0);
  }
  fmt::print(
      "{:<44} {:>10.1f}   ({} iterations after {} warm-up; compute ops: max over devices, CCLs: "
      "mean over devices)\n",
      "total kernel duration", total, kIters, kWarmup);
  return failed;
}

}  // namespace meshtest::dist
