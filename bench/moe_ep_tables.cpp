// moe_ep_tables (bench/moe_tables.hpp): tables (b) and (c) of meshtest-bench moe — the EP
// dispatch + combine against the minimum bytes and all_gather-everything, and the EP MLP block
// against the all_gather-everything and TP blocks on the same mesh.
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "bench/moe_schemes.hpp"
#include "bench/moe_tables.hpp"
#include "dist/ccl/all_gather.hpp"
#include "dist/ccl/all_to_all.hpp"
#include "dist/ccl/reduce_scatter.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "dist/parallel/tensor_parallel.hpp"
#include "dist/perf/e2e.hpp"
#include "src/check/gpt_oss_chains.hpp"
#include "src/check/metrics.hpp"
#include "src/core/random.hpp"
#include "src/ops/linear.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::bench {
namespace {

using dist::MeshDevice;

constexpr double kBytesTarget = 1.1;  // the target: EP bytes <= 1.1 x the minimum

/// The exchanges are cheap beside the blocks: they are timed over this many times o.iters calls.
constexpr int kExchangeCalls = 10;

/// Seconds per call of f: o.warmup calls (less `done`, the calls just made), then `calls` each
/// after a barrier, the slowest device's time (dist::time_e2e); their mean and minimum.
struct Timing {
  double mean = 0, min = 0;
};
Timing timing(const MeshDevice& mesh, const MoeBenchOptions& o, const std::function<void()>& f,
              int done = 0, int calls = 0) {
  const dist::E2eOptions e2e{.warmup = std::max(0, o.warmup - done),
                             .iterations = calls > 0 ? calls : o.iters};
  const perf::E2eStats st = dist::time_e2e(mesh, f, e2e);
  return {.mean = st.mean_us * 1e-6, .min = st.min_us * 1e-6};
}

double max_over(const MeshDevice& mesh, double v) {
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, mesh.comm()));
  return v;
}

/// ep_mlp_block's exchanges from its CCL records (o.iters calls under the profiler): the mean
/// seconds per call of the side lists, the dispatch and the combine (its three all_to_all_v;
/// slowest device; they include waiting for slower devices), and whether every record carried
/// the side values and rows ep_traffic counted for this device.
struct InBlock {
  std::array<double, 3> seconds{};
  bool rows_match = true;
};
InBlock in_block(const MeshDevice& mesh, const EpProblem& s, const MoeBenchOptions& o) {
  const DeviceTraffic& me = s.traffic[static_cast<std::size_t>(s.w.device)];
  const auto sum = [](const std::vector<std::int64_t>& v) {
    return std::accumulate(v.begin(), v.end(), std::int64_t{0});
  };
  const std::array<std::int64_t, 3> want{sum(me.side_to), sum(me.to), sum(me.from)};
  std::vector<perf::OpRecord> recs;
  {
    const perf::Session session;
    for (int it = 0; it < o.iters; ++it) dist::ep_mlp_block(mesh, s.x, s.w, s.p, s.o);
    recs = perf::records();
  }
  InBlock b;
  int v = 0;
  for (const perf::OpRecord& r : recs) {
    if (r.op_type != perf::OpType::ccl || r.op_code != "all_to_all_v") continue;
    const auto step = static_cast<std::size_t>(v++ % 3);
    b.seconds[step] += static_cast<double>(r.duration_ns()) * 1e-9 / o.iters;
    b.rows_match = b.rows_match && !r.inputs.empty() && r.inputs[0].shape[0] == want[step];
  }
  b.rows_match = b.rows_match && v == 3 * o.iters;
  for (double& sec : b.seconds) sec = max_over(mesh, sec);
  b.rows_match = max_over(mesh, b.rows_match ? 0.0 : 1.0) == 0.0;
  return b;
}

void exchange_table(const MeshDevice& mesh, const MoeBenchOptions& o, const EpProblem& s,
                    nlohmann::json& doc, Verdicts& v) {
  const int d_size = s.placement.num_devices;
  const DeviceTraffic& me = s.traffic[static_cast<std::size_t>(s.w.device)];
  // The replay: ep_mlp_block's three exchanges with this run's counts and shapes.
  const Tensor side(Shape{std::accumulate(me.side_to.begin(), me.side_to.end(), std::int64_t{0})},
                    DType::f64);
  const std::int64_t send_rows = std::accumulate(me.to.begin(), me.to.end(), std::int64_t{0});
  const Tensor rows = random_uniform(Shape{send_rows, o.hidden}, DType::f32, {.seed = 3});
  const int calls = kExchangeCalls * o.iters;
  const Timing ep_t = timing(
      mesh, o,
      [&] {
        dist::all_to_all_v(mesh, side, me.side_to, {.axis = o.ep_axis});
        const Tensor got = dist::all_to_all_v(mesh, rows, me.to, {.axis = o.ep_axis});
        dist::all_to_all_v(mesh, got, me.from, {.axis = o.ep_axis});
      },
      0, calls);
  const Timing ag_t = timing(
      mesh, o,
      [&] {
        const Tensor all = dist::all_gather(mesh, s.x, {.dim = 0, .axis = o.ep_axis});
        dist::reduce_scatter(mesh, all, {.dim = 0, .axis = o.ep_axis});
      },
      0, calls);
  const InBlock blk = in_block(mesh, s, o);
  if (mesh.device_id() != 0) return;
  // The verdict compares the fastest calls: robust on a shared machine (the means are printed).
  const double ep_s = ep_t.min, ag_s = ag_t.min;

  const double row_bytes = 4.0 * static_cast<double>(o.hidden);
  // Sent + received: every row scheme receives what it sends. EP's control bytes: its side
  // lists (f64 values, itself excluded) and the count matrix each of its 3 all_to_all_v
  // all-gathers (D int64 to and from each other device).
  const double counts_bytes = 3.0 * 2.0 * (d_size - 1) * d_size * 8.0;
  const auto mb = [&](std::int64_t each_way) { return 2.0 * row_bytes * each_way / 1e6; };
  const auto control = [&](const DeviceTraffic& t) {
    return 8.0 * static_cast<double>(t.side_values) + counts_bytes;
  };
  fmt::print(
      "\n(b) dispatch + combine on the EP axis ({} devices): ep_mlp_block's side lists "
      "(all_to_all_v of f64: per device T_local, the rows, and per row its local experts and "
      "routing weights), rows (all_to_all_v: each token once per device holding one of its "
      "experts) and the rows back (reverse all_to_all_v: one per received token), against the "
      "minimum (one row per token and distinct other device holding one of its experts, and "
      "one back) and all_gather-everything (all_gather of the tokens, reduce_scatter of the "
      "partial outputs, direct algorithm). A row = hidden f32 = {} B; rows are each way (every "
      "scheme receives what it sends), MB = sent + received (EP's with its control bytes: side "
      "lists and the 3 count matrices of {} B); msgs = non-empty row messages sent{}\n",
      d_size, row_bytes, counts_bytes,
      mesh.axis_size(1 - o.ep_axis) > 1 ? "; every TP replica makes the same exchange" : "");
  fmt::print(
      "{:>6} {:>6} {:>7} {:>7} {:>7} | {:>8} {:>8} {:>9} {:>4} | {:>8} {:>9} {:>6} | {:>8} "
      "{:>9} {:>6}\n",
      "device", "tokens", "experts", "rows in", "pairs", "EP rows", "side KB", "EP MB", "msgs",
      "min rows", "min MB", "EP/min", "AG rows", "AG MB", "AG/EP");
  std::int64_t min_total = 0, min_max = 0, ag_max = 0, msgs_max = 0;
  double ep_bytes = 0, ep_max = 0, control_max = 0;
  nlohmann::json devices = nlohmann::json::array();
  for (int d = 0; d < d_size; ++d) {
    const DeviceTraffic& t = s.traffic[static_cast<std::size_t>(d)];
    const std::int64_t in = std::accumulate(t.from.begin(), t.from.end(), std::int64_t{0});
    const double ep_mb = mb(t.ep_rows) + control(t) / 1e6;
    fmt::print(
        "{:>6} {:>6} {:>7} {:>7} {:>7} | {:>8} {:>8.2f} {:>9.3f} {:>4} | {:>8} {:>9.3f} {:>6} | "
        "{:>8} {:>9.3f} {:>6}\n",
        d, t.tokens, t.experts, in, t.pairs, t.ep_rows, 8.0 * t.side_values / 1e3, ep_mb,
        t.messages, t.min_rows, mb(t.min_rows),
        t.min_rows > 0 ? fmt::format("{:.3f}", ep_mb / mb(t.min_rows)) : "-", t.ag_rows,
        mb(t.ag_rows), ep_mb > 0 ? fmt::format("{:.2f}", mb(t.ag_rows) / ep_mb) : "-");
    ep_bytes += ep_mb * 1e6, min_total += t.min_rows;
    ep_max = std::max(ep_max, ep_mb), min_max = std::max(min_max, t.min_rows);
    control_max = std::max(control_max, control(t));
    ag_max = std::max(ag_max, t.ag_rows), msgs_max = std::max(msgs_max, t.messages);
    devices.push_back({{"device", d},
                       {"tokens", t.tokens},
                       {"experts", t.experts},
                       {"rows_in", in},
                       {"pairs", t.pairs},
                       {"ep_rows", t.ep_rows},
                       {"side_bytes", 8 * t.side_values},
                       {"min_rows", t.min_rows},
                       {"ag_rows", t.ag_rows},
                       {"messages", t.messages}});
  }
  const double ratio = min_total > 0 ? ep_bytes / (2.0 * row_bytes * min_total) : 1.0;
  fmt::print(
      "bytes per device (max over devices): EP {:.3f} MB (rows, and {:.0f} B of side lists and "
      "count matrices at most), minimum {:.3f} MB, all_gather-everything {:.3f} MB; EP / minimum "
      "over all devices = {:.3f} (target <= {})\n",
      ep_max, control_max, mb(min_max), mb(ag_max), ratio, kBytesTarget);
  fmt::print(
      "steps per device: EP 3 CCL calls (side lists, dispatch, combine) = 3 x {} messages in a "
      "pairwise exchange, of which {} carry rows at most; all_gather-everything 2 CCL calls "
      "(all_gather, reduce_scatter) = 2 x {} steps\n",
      d_size - 1, msgs_max, d_size - 1);
  fmt::print(
      "time per dispatch + combine (replayed alone with this run's counts and shapes; min (mean) "
      "of {} calls, each after a barrier, slowest device): EP {:.3f} ms ({:.3f}), "
      "all_gather-everything {:.3f} ms ({:.3f}): by the min, EP {:.2f}x {}\n",
      calls, ep_t.min * 1e3, ep_t.mean * 1e3, ag_t.min * 1e3, ag_t.mean * 1e3,
      ep_s < ag_s ? ag_s / ep_s : ep_s / ag_s, ep_s < ag_s ? "faster" : "slower");
  fmt::print(
      "inside ep_mlp_block (its CCL records, mean of {} calls, slowest device; they include "
      "waiting for slower devices): side lists {:.3f} ms, dispatch {:.3f} ms, combine {:.3f} ms; "
      "the records' side values and rows equal the counted ones: {}\n",
      o.iters, blk.seconds[0] * 1e3, blk.seconds[1] * 1e3, blk.seconds[2] * 1e3,
      blk.rows_match ? "yes" : "NO");
  if (!blk.rows_match) ++v.failed;
  v.lines.push_back(
      fmt::format("dispatch + combine bytes <= {} x minimum: EP / minimum = {:.3f}: {}",
                  kBytesTarget, ratio, ratio <= kBytesTarget ? "meets" : "misses"));
  v.lines.push_back(fmt::format(
      "dispatch + combine faster than all_gather-everything at 8 ranks: EP {:.3f} ms, "
      "all_gather {:.3f} ms (min of the calls) at {} EP devices: {}",
      ep_s * 1e3, ag_s * 1e3, d_size,
      d_size != 8 ? (ep_s < ag_s ? "faster (not the 8-rank case)" : "slower (not the 8-rank case)")
                  : (ep_s < ag_s ? "meets" : "misses")));
  doc["exchange"] = {
      {"devices", devices},
      {"row_bytes", row_bytes},
      {"count_matrix_bytes", counts_bytes},
      {"ep_over_min", ratio},
      {"ep_mean_ms", ep_t.mean * 1e3},
      {"ep_min_ms", ep_t.min * 1e3},
      {"all_gather_mean_ms", ag_t.mean * 1e3},
      {"all_gather_min_ms", ag_t.min * 1e3},
      {"in_block_ms", {blk.seconds[0] * 1e3, blk.seconds[1] * 1e3, blk.seconds[2] * 1e3}},
      {"rows_match", blk.rows_match}};
}

/// One row of table (c).
struct BlockRow {
  std::string layout;
  std::int64_t tokens = 0;  ///< tokens of device 0
  double weight_mb = 0;     ///< device 0's expert weights and biases
  Timing time;
  double diff = 0;
  std::string skipped;  ///< why the row was not run
};

double expert_mb(const MlpWeights& m) {
  return static_cast<double>(m.mlp1_weight.nbytes() + m.mlp1_bias.nbytes() +
                             m.mlp2_weight.nbytes() + m.mlp2_bias.nbytes()) /
         1e6;
}

/// max |out − ref| over the tokens both hold (out: tokens `r`, ref: tokens `ref_r`), max over
/// devices, over max |ref| (max over devices). Collective.
double relative_diff(const MeshDevice& mesh, const Tensor& out, Range r, const Tensor& ref,
                     Range ref_r) {
  const std::int64_t lo = std::max(r.start, ref_r.start);
  const std::int64_t hi = std::min(r.start + r.size, ref_r.start + ref_r.size);
  double diff = 0, scale = 0;
  if (hi > lo) {
    diff =
        max_abs_error(ref.slice(0, lo - ref_r.start, hi - lo), out.slice(0, lo - r.start, hi - lo));
  }
  for (std::int64_t i = 0; i < ref.numel(); ++i) scale = std::max(scale, std::abs(ref.item(i)));
  return max_over(mesh, diff) / std::max(max_over(mesh, scale), 1e-30);
}

/// A row of the EP layout (s's tokens and weights): `out` (one call of `block`, made by the
/// caller) against ep_out, and the time of `block`.
BlockRow ep_layout_row(const MeshDevice& mesh, const MoeBenchOptions& o, const EpProblem& s,
                       std::string layout, const Tensor& out, const Tensor& ep_out,
                       const std::function<void()>& block) {
  BlockRow row;
  row.layout = std::move(layout);
  row.tokens = s.mine.size;
  row.weight_mb = expert_mb(s.w.mlp);
  row.diff = relative_diff(mesh, out, s.mine, ep_out, s.mine);
  row.time = timing(mesh, o, block, 1);  // the call that made `out` warmed it up
  return row;
}

/// tp_mlp_block with TP on `tp_axis` and the tokens split over the other axis.
BlockRow tp_row(const MeshDevice& mesh, const MoeBenchOptions& o, const EpProblem& s,
                const Tensor& ep_out, int tp_axis) {
  const dist::TpOptions to{.tp_axis = tp_axis};
  const int tp = mesh.axis_size(tp_axis), token_axis = 1 - tp_axis;
  BlockRow row;
  row.layout = fmt::format("TP on axis {} ({}), tokens on axis {} ({})", tp_axis, tp, token_axis,
                           mesh.axis_size(token_axis));
  if (tp == 1) {
    row.skipped = "skipped: TP 1 holds every expert whole on every device";
    return row;
  }
  if (o.intermediate % tp != 0) {
    row.skipped =
        fmt::format("skipped: TP {} does not divide the intermediate {}", tp, o.intermediate);
    return row;
  }
  const Range r = split_range(s.tokens, mesh.axis_size(token_axis), mesh.axis_index(token_axis));
  const Tensor x = ep_tokens(o, s.tokens, r);
  const MlpWeights w = dist::shard_mlp_weights(s.src, s.c, 0, dist::tp_rank(mesh, to));
  row.tokens = r.size;
  row.weight_mb = expert_mb(w);
  row.diff = relative_diff(mesh, dist::tp_mlp_block(mesh, x, w, s.p, to), r, ep_out, s.mine);
  row.time = timing(
      mesh, o, [&] { dist::tp_mlp_block(mesh, x, w, s.p, to); }, 1);
  return row;
}

void block_table(const MeshDevice& mesh, const MoeBenchOptions& o, const EpProblem& s,
                 nlohmann::json& doc, Verdicts& v) {
  const int ep = s.placement.num_devices, tp = mesh.axis_size(1 - o.ep_axis);
  const Tensor ep_out = dist::ep_mlp_block(mesh, s.x, s.w, s.p, s.o);
  std::vector<BlockRow> rows;
  rows.push_back(ep_layout_row(
      mesh, o, s,
      fmt::format("EP on axis {} ({}), TP on axis {} ({})", o.ep_axis, ep, 1 - o.ep_axis, tp),
      ep_out, ep_out, [&] { dist::ep_mlp_block(mesh, s.x, s.w, s.p, s.o); }));
  rows.push_back(ep_layout_row(mesh, o, s, "all_gather-everything, EP layout",
                               all_gather_mlp_block(mesh, s.x, s.w, s.p, s.o), ep_out,
                               [&] { all_gather_mlp_block(mesh, s.x, s.w, s.p, s.o); }));
  rows.push_back(tp_row(mesh, o, s, ep_out, o.ep_axis));
  rows.push_back(tp_row(mesh, o, s, ep_out, 1 - o.ep_axis));
  // max |out − EP out| / max |EP out| may reach the error model's bound per unit of scale for
  // the MLP block's chain (both layouts add its terms in their own order, f32; the TP size is at
  // most the whole mesh's: the larger bound).
  const double tolerance = error_bound(mlp_chain(s.c, mesh.size()).model(DType::f32), 1.0, 1.0);
  nlohmann::json out = nlohmann::json::array();
  int failed = 0;
  for (const BlockRow& r : rows) failed += r.skipped.empty() && r.diff > tolerance ? 1 : 0;
  v.failed += failed;
  if (mesh.device_id() != 0) return;
  fmt::print(
      "\n(c) the MoE MLP block on mesh {} (x [T_local, hidden] -> [T_local, hidden], router "
      "included): time = mean (and min) of {} calls, each after a barrier, slowest device; x EP "
      "= mean / EP's mean; tokens and "
      "expert MB (mlp1/mlp2 weights and biases) of device 0; diff = max |out − EP out| / max |EP "
      "out| over the tokens both hold (check <= {:g})\n",
      mesh.str(), o.iters, tolerance);
  fmt::print("{:<42} {:>10} {:>13} {:>10} {:>10} {:>6} {:>9}  {}\n", "layout", "tokens/dev",
             "expert MB/dev", "ms", "min ms", "x EP", "diff", "check");
  for (const BlockRow& r : rows) {
    if (!r.skipped.empty()) {
      fmt::print("{:<42} {}\n", r.layout, r.skipped);
      out.push_back({{"layout", r.layout}, {"skipped", r.skipped}});
      continue;
    }
    const bool ok = r.diff <= tolerance;
    fmt::print("{:<42} {:>10} {:>13.3f} {:>10.3f} {:>10.3f} {:>6.2f} {:>9.2e}  {}\n", r.layout,
               r.tokens, r.weight_mb, r.time.mean * 1e3, r.time.min * 1e3,
               r.time.mean / rows[0].time.mean, r.diff, ok ? "PASS" : "FAIL");
    out.push_back({{"layout", r.layout},
                   {"tokens_per_device", r.tokens},
                   {"expert_mb_per_device", r.weight_mb},
                   {"ms", r.time.mean * 1e3},
                   {"min_ms", r.time.min * 1e3},
                   {"relative_diff", r.diff},
                   {"pass", ok}});
  }
  doc["blocks"] = out;
  v.lines.push_back(fmt::format("the EP block's output equals the other layouts' (<= {:g}): {}",
                                tolerance, failed == 0 ? "PASS" : "FAIL"));
}

}  // namespace

/// Rows r of the tokens x [T, hidden] (normal; element i depends only on the seed and i).
Tensor ep_tokens(const MoeBenchOptions& o, std::int64_t tokens, Range r) {
  return generate_slice(Shape{tokens, o.hidden}, 0, r, DType::f32, {.seed = o.seed, .stream = 20},
                        Normal{});
}

EpProblem make_ep_problem(const MeshDevice& mesh, const MoeBenchOptions& o, std::int64_t tokens) {
  EpProblem s;
  s.tokens = tokens;
  s.o = {.ep_axis = o.ep_axis};
  s.c.hidden_size = o.hidden;
  s.c.intermediate_size = o.intermediate;
  s.c.num_experts = o.experts;
  s.c.experts_per_token = o.k;
  s.p = s.c.moe_params();
  s.src = random_mlp_source(s.c, o.seed);
  const dist::TpRank ep = dist::ep_rank(mesh, s.o);
  s.placement = dist::place_experts(dist::ExpertAssignment::Contiguous, o.experts, ep.size);
  s.w =
      dist::shard_ep_mlp_weights(s.src, s.c, 0, s.placement, ep.index, dist::ep_tp_rank(mesh, s.o));
  s.mine = split_range(tokens, ep.size, ep.index);
  s.x = ep_tokens(o, tokens, s.mine);
  // The routing ep_mlp_block computes for these tokens (the same ops), gathered over EP.
  const Routing r = route_top_k(linear(rms_norm(s.x, s.w.mlp.norm_scale, s.p.norm_eps),
                                       s.w.mlp.gate_weight, s.w.mlp.gate_bias),
                                o.k);
  s.traffic = ep_traffic_of(mesh, r, s.placement, o.ep_axis);
  return s;
}

std::vector<DeviceTraffic> ep_traffic_of(const MeshDevice& mesh, const Routing& r,
                                         const ExpertPlacement& placement, int ep_axis) {
  const Tensor mine =
      Tensor::from_vector(Shape{static_cast<std::int64_t>(r.experts.size())}, r.experts);
  const Tensor all = dist::all_gather(mesh, mine, {.dim = 0, .axis = ep_axis});
  return ep_traffic(all.span<std::int64_t>(), r.k, placement);
}

void ep_tables(const MeshDevice& mesh, const MoeBenchOptions& o, nlohmann::json& doc, Verdicts& v) {
  const EpProblem s = make_ep_problem(mesh, o, o.tokens);
  if (o.parts.count("exchange") != 0) exchange_table(mesh, o, s, doc, v);
  if (o.parts.count("block") != 0) block_table(mesh, o, s, doc, v);
}

}  // namespace meshtest::bench
