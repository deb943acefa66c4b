// moe_tables (bench/moe_tables.hpp): the header and table (a) of meshtest-bench moe, grouped
// GEMM against one dense Eigen GEMM of the same total size. Tables (b) and (c) are in
// moe_ep_tables.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "bench/moe_tables.hpp"
#include "src/core/random.hpp"
#include "src/ops/moe/grouped_gemm.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::bench {
namespace {

constexpr double kGemmTarget = 0.8;  // the target: grouped >= 0.8 x dense GFLOP/s

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::vector<std::int64_t> segment_offsets(const std::string& routing, std::int64_t rows,
                                          std::int64_t experts) {
  std::vector<std::int64_t> count(static_cast<std::size_t>(experts), 0);
  if (routing == "uniform") {
    for (std::int64_t e = 0; e < experts; ++e) {
      count[static_cast<std::size_t>(e)] =
          split_range(rows, static_cast<int>(experts), static_cast<int>(e)).size;
    }
  } else if (routing == "zipf") {
    double total = 0;
    for (std::int64_t e = 0; e < experts; ++e) total += 1.0 / static_cast<double>(e + 1);
    std::int64_t given = 0;
    for (std::int64_t e = 0; e < experts; ++e) {
      count[static_cast<std::size_t>(e)] = static_cast<std::int64_t>(
          static_cast<double>(rows) / (static_cast<double>(e + 1) * total));
      given += count[static_cast<std::size_t>(e)];
    }
    for (std::int64_t e = 0; given < rows; e = (e + 1) % experts, ++given) {
      ++count[static_cast<std::size_t>(e)];
    }
  } else {
    count[0] = rows;
  }
  std::vector<std::int64_t> offsets{0};
  for (const std::int64_t c : count) offsets.push_back(offsets.back() + c);
  return offsets;
}

SegmentUse segment_use(const std::vector<std::int64_t>& offsets) {
  SegmentUse u;
  for (std::size_t e = 0; e + 1 < offsets.size(); ++e) {
    u.used += offsets[e + 1] > offsets[e] ? 1 : 0;
    u.largest = std::max(u.largest, offsets[e + 1] - offsets[e]);
  }
  return u;
}

nlohmann::json gemm_row(const GemmSize& g, const std::string& routing, SegmentUse use,
                        double grouped_ms, double dense_ms, double ratio) {
  const double flops = 2.0 * static_cast<double>(g.rows * g.in) * static_cast<double>(g.out);
  return {{"rows", g.rows},
          {"in", g.in},
          {"out", g.out},
          {"experts", g.experts},
          {"routing", routing},
          {"experts_used", use.used},
          {"largest_segment", use.largest},
          {"grouped_ms", grouped_ms},
          {"dense_ms", dense_ms},
          {"grouped_gflops", flops / grouped_ms * 1e-6},
          {"dense_gflops", flops / dense_ms * 1e-6},
          {"ratio", ratio}};
}

bool GemmTally::add(const GemmSize& g, const std::string& routing, double ratio, bool ok) {
  meets += ok ? 1 : 0;
  ++total;
  if (!ok) {
    misses += fmt::format("{}{}x{}x{}x{} {} {:.3f}", misses.empty() ? "" : ", ", g.rows, g.in,
                          g.out, g.experts, routing, ratio);
  }
  return ok;
}

nlohmann::json moe_header(const dist::MeshDevice& mesh, const MoeBenchOptions& o) {
  const int ep = mesh.axis_size(o.ep_axis), tp = mesh.axis_size(1 - o.ep_axis);
  if (mesh.device_id() == 0) {
    fmt::print(
        "meshtest-bench moe: mesh {} ({} devices): EP on axis {} ({} devices), TP on axis {} "
        "({}); hidden {}, intermediate {}, {} experts top-{}, T = {} tokens; {}, random "
        "weights (seed {}), contiguous expert placement; {} warm-up + {} measured calls per "
        "figure\n",
        mesh.str(), mesh.size(), o.ep_axis, ep, 1 - o.ep_axis, tp, o.hidden, o.intermediate,
        o.experts, o.k, o.tokens, o.device == "cuda" ? o.dtype + " on cuda" : "f32", o.seed,
        o.warmup, o.iters);
  }
  return {{"bench", "moe"},
          {"mesh", mesh.str()},
          {"ep_axis", o.ep_axis},
          {"ep_size", ep},
          {"tp_size", tp},
          {"hidden", o.hidden},
          {"intermediate", o.intermediate},
          {"experts", o.experts},
          {"k", o.k},
          {"tokens", o.tokens},
          {"iters", o.iters},
          {"warmup", o.warmup},
          {"seed", o.seed},
          {"device", o.device},
          {"dtype", o.device == "cuda" ? o.dtype : "f32"}};
}

nlohmann::json gemm_table(const MoeBenchOptions& o, Verdicts& v) {
  fmt::print(
      "\n(a) grouped GEMM (grouped_gemm, f32) against one dense Eigen GEMM of the same total "
      "size (C[rows, out] = A[rows, in] · B[out, in]ᵀ into a preallocated C), measured on rank 0 "
      "alone (the other ranks wait); median of {} interleaved calls after {} warm-up; GFLOP/s = "
      "2·rows·in·out / time; used = experts with rows; ratio = grouped / dense (target >= "
      "{})\n",
      o.iters, o.warmup, kGemmTarget);
  fmt::print("{:>6} {:>6} {:>6} {:>4}  {:<10} {:>4} {:>7} {:>10} {:>8} {:>10} {:>8} {:>6}  {}\n",
             "rows", "in", "out", "E", "routing", "used", "largest", "grouped ms", "GFLOP/s",
             "dense ms", "GFLOP/s", "ratio", "target");
  nlohmann::json rows = nlohmann::json::array();
  GemmTally tally;
  for (const GemmSize& g : o.gemms) {
    const Tensor x =
        random_uniform(Shape{g.rows, g.in}, DType::f32, {.seed = o.seed, .stream = 11}, -1, 1);
    const Tensor w = random_uniform(Shape{g.experts, g.out, g.in}, DType::f32,
                                    {.seed = o.seed, .stream = 12}, -1, 1);
    const auto a = x.matrix<float>();
    const Eigen::Map<const RowMatrix<float>> b(w.data<float>(), g.out, g.in);
    RowMatrix<float> dense(g.rows, g.out);
    const double flops = 2.0 * static_cast<double>(g.rows * g.in) * static_cast<double>(g.out);
    for (const std::string routing : {"uniform", "zipf", "all-to-one"}) {
      const std::vector<std::int64_t> offsets = segment_offsets(routing, g.rows, g.experts);
      std::vector<double> grouped_s, dense_s;
      for (int it = 0; it < o.warmup + o.iters; ++it) {
        const std::int64_t t0 = perf::now_ns();
        const Tensor y = grouped_gemm(x, offsets, w);
        const std::int64_t t1 = perf::now_ns();
        dense.noalias() = a * b.transpose();
        const std::int64_t t2 = perf::now_ns();
        if (it < o.warmup) continue;
        grouped_s.push_back(static_cast<double>(t1 - t0) * 1e-9);
        dense_s.push_back(static_cast<double>(t2 - t1) * 1e-9);
      }
      const SegmentUse use = segment_use(offsets);
      const double gs = median(grouped_s), ds = median(dense_s);
      const double ratio = ds / gs;
      const bool ok = tally.add(g, routing, ratio, ratio >= kGemmTarget);
      fmt::print(
          "{:>6} {:>6} {:>6} {:>4}  {:<10} {:>4} {:>7} {:>10.2f} {:>8.1f} {:>10.2f} {:>8.1f} "
          "{:>6.3f}  {}\n",
          g.rows, g.in, g.out, g.experts, routing, use.used, use.largest, gs * 1e3,
          flops / gs * 1e-9, ds * 1e3, flops / ds * 1e-9, ratio, ok ? "meets" : "misses");
      rows.push_back(gemm_row(g, routing, use, gs * 1e3, ds * 1e3, ratio));
    }
  }
  v.lines.push_back(fmt::format("grouped GEMM >= {} x dense GFLOP/s: meets on {} of {} rows{}{}",
                                kGemmTarget, tally.meets, tally.total,
                                tally.misses.empty() ? "" : "; misses: ", tally.misses));
  return rows;
}

}  // namespace meshtest::bench
