// Demo section: a tensor-parallel MLP step (compute ops and CCLs) profiled on every device,
// aggregated the mesh-device way and written to reports/demo/.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dist/ccl/ccl.hpp"
#include "dist/perf/e2e.hpp"
#include "dist/perf/gather.hpp"
#include "src/core/random.hpp"
#include "src/ops/activations.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/rms_norm.hpp"
#include "src/perf/measurements.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/report.hpp"
#include "tools/demo_sections.hpp"

namespace meshtest::dist {

namespace {

constexpr int kWarmup = 3, kIterations = 10;

/// Runs a compute op under an OpScope that records its inputs (with their placements) and
/// output; the op's own scope, if it has one, is the leaf that is kept.
template <class F>
Tensor compute(std::string_view op,
               std::initializer_list<std::pair<const char*, std::string>> attributes,
               std::initializer_list<std::pair<const Tensor*, const char*>> in,
               const char* out_memory, F&& f) {
  perf::OpScope s(op);
  for (const auto& [key, value] : attributes) s.attr(key, value);
  for (const auto& [t, mem] : in) s.input(*t, mem);
  Tensor y = f();
  s.output(y, out_memory);
  return y;
}

/// One step on this device's shards (rows T = 64, hidden H = 256, intermediate 2I = 512):
///   h = rms_norm(x)                 x [T, H] Replicate
///   u = linear(h, w1)               w1 [2I / cols, H] (a row shard)  -> [T, 2I / cols]
///   g = swiglu(u)                   -> [T, I / cols]
///   p = linear(g, w2)               w2 [H, I / cols]; partial sums over the mesh row -> [T, H]
///   y = all_reduce(p, axis 1)       -> [T, H]
///   z = all_gather(y, axis 0, dim 0), then reduce_scatter(z, axis 0, dim 0) -> [T, H]
Tensor step(const MeshDevice& mesh, const Tensor& x, const Tensor& scale, const Tensor& w1,
            const Tensor& w2) {
  const Tensor h = compute("rms_norm", {{"eps", fmt::format("{}", kRmsNormEps)}},
                           {{&x, "Replicate"}, {&scale, "Replicate"}}, "Replicate",
                           [&] { return rms_norm(x, scale); });
  const Tensor u = compute("linear", {{"bias", "none"}}, {{&h, "Replicate"}, {&w1, "Shard(0)"}},
                           "Shard(1)", [&] { return linear(h, w1); });
  const Tensor g = compute(
      "swiglu",
      {{"alpha", fmt::format("{}", kSwigluAlpha)}, {"limit", fmt::format("{}", kSwigluLimit)}},
      {{&u, "Shard(1)"}}, "Shard(1)", [&] { return swiglu(u); });
  const Tensor p = compute("linear", {{"bias", "none"}}, {{&g, "Shard(1)"}, {&w2, "Shard(1)"}},
                           "Partial", [&] { return linear(g, w2); });
  const Tensor y = all_reduce(mesh, p, {.axis = 1});
  const Tensor z = all_gather(mesh, y, {.dim = 0, .axis = 0});
  return reduce_scatter(mesh, z, {.dim = 0, .axis = 0});
}

}  // namespace

int demo_perf(const MeshDevice& mesh) {
  constexpr std::int64_t T = 64, H = 256, I2 = 512;
  // This device's share of the intermediate columns (any mesh width; swiglu halves it).
  const std::int64_t half = std::max<std::int64_t>(1, I2 / mesh.cols() / 2);
  const std::uint64_t dev = static_cast<std::uint64_t>(mesh.device_id());
  const Tensor x = random_normal({T, H}, DType::f32, {.seed = 11});
  const Tensor scale = random_uniform({H}, DType::f32, {.seed = 12}, 0.5, 1.5);
  const Tensor w1 = random_normal({2 * half, H}, DType::f32, {.seed = 100 + dev}, 0, 0.05);
  const Tensor w2 = random_normal({H, half}, DType::f32, {.seed = 200 + dev}, 0, 0.05);

  // End to end, profiling off: 10 warm-up and 100 measured steps, slowest device per step.
  const perf::E2eStats e2e = time_e2e(mesh, [&] { step(mesh, x, scale, w1, w2); });

  std::vector<perf::OpRecord> records;
  {
    perf::Session session;
    for (int it = 0; it < kWarmup + kIterations; ++it) {
      if (it >= kWarmup) perf::signpost("start");
      step(mesh, x, scale, w1, w2);
      if (it >= kWarmup) perf::signpost("stop");
    }
    records = gather_records(mesh, perf::records());
  }
  if (mesh.device_id() != 0) return 0;
  const perf::ReportFiles f = perf::write_report(
      records, {.name = "demo", .aggregate = {.devices = mesh.size()}, .e2e = e2e});
  const perf::Aggregate& a = f.aggregate;
  fmt::print(
      "\nperf: a tensor-parallel MLP step on mesh {} ({} devices), {} warm-up + {} measured "
      "iterations, each between signposts; per op: compute = slowest device, ccl = mean over "
      "devices, then the average over iterations\n\n{}",
      mesh.str(), mesh.size(), kWarmup, kIterations, perf::summary_table(a));
  fmt::print(
      "total_kernel_duration_us = {:.1f}, total_op_to_op_latency_us = {:.1f}; e2e per step "
      "(profiling off, {} warm-up, {} measured): mean {:.1f} us, min {:.1f}, max {:.1f}, std "
      "{:.1f}\n",
      a.total_kernel_duration_us, a.total_op_to_op_latency_us, e2e.warmup, e2e.iterations,
      e2e.mean_us, e2e.min_us, e2e.max_us, e2e.std_us);
  fmt::print("reports: {}, {}, {}{}\n", f.csv.string(), f.measurements.string(), f.trace.string(),
             f.plot.empty() ? fmt::format(" ({})", f.plot_note) : ", " + f.plot.string());
  return 0;
}

}  // namespace meshtest::dist
