// dist/perf: records gathered from every device; the last device slowed inside one compute
// op shows up as that op's aggregated duration, and a CCL gets the mean over devices; e2e
// timing; options that differ between devices fail on every device.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "dist/ccl/all_reduce.hpp"
#include "dist/perf/e2e.hpp"
#include "dist/perf/gather.hpp"
#include "src/core/random.hpp"
#include "src/perf/aggregate.hpp"
#include "src/perf/ops_csv.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/report.hpp"
#include "tests/support/chrome_trace_check.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest::dist {
namespace {

constexpr auto kSlow = std::chrono::milliseconds(30);
constexpr std::int64_t kSlowNs = 30'000'000;

/// Durations (ns) of the measured calls of `op` per device: [device][iteration]. The first
/// call of each device is the warm-up. Read straight from the raw records.
std::map<int, std::vector<std::int64_t>> raw_durations(const std::vector<perf::OpRecord>& all,
                                                       const std::string& op) {
  std::map<int, std::vector<std::int64_t>> out;
  std::map<int, int> seen;
  for (const perf::OpRecord& r : all) {
    if (r.op_code != op) continue;
    if (seen[r.device_id]++ == 0) continue;  // warm-up
    out[r.device_id].push_back(r.end_ns - r.start_ns);
  }
  return out;
}

TEST(PerfAggregate, SlowDeviceForComputeMeanForCcl) {
  const MeshDevice mesh = MeshDevice::line();
  const int last = mesh.size() - 1;
  constexpr int kIterations = 2;
  const Tensor x = random_normal({16, 8}, DType::f32, {.seed = 3});
  std::vector<perf::OpRecord> all;
  {
    perf::Session session;
    for (int it = -1; it < kIterations; ++it) {
      if (it >= 0) perf::signpost("start");
      {
        perf::OpScope s("slow_op");
        s.input(x).attr("slowed_device", last);
        if (mesh.device_id() == last) std::this_thread::sleep_for(kSlow);
        s.output(x);
      }
      const Tensor y = all_reduce(mesh, x);
      if (it >= 0) perf::signpost("stop");
    }
    all = gather_records(mesh, perf::records());
  }
  if (mesh.device_id() != 0) {
    EXPECT_TRUE(all.empty());
    return;
  }
  const perf::Aggregate a = perf::aggregate(all, {.devices = mesh.size()});
  ASSERT_EQ(a.ops.size(), 2u);
  ASSERT_EQ(a.iterations, kIterations);
  EXPECT_EQ(a.ops[0].op_code, "slow_op");
  EXPECT_EQ(a.ops[1].op_code, "all_reduce");
  EXPECT_EQ(a.ops[1].op_type, perf::OpType::ccl);

  // Expectations from the raw gathered records: per iteration the max (slow_op) or the mean
  // (all_reduce) over devices, then the mean over iterations.
  const auto slow = raw_durations(all, "slow_op");
  const auto ccl = raw_durations(all, "all_reduce");
  ASSERT_EQ(static_cast<int>(slow.size()), mesh.size());
  ASSERT_EQ(static_cast<int>(ccl.size()), mesh.size());
  double want_slow = 0, want_ccl = 0;
  for (int it = 0; it < kIterations; ++it) {
    std::int64_t mx = 0;
    double sum = 0;
    for (int d = 0; d < mesh.size(); ++d) {
      mx = std::max(mx, slow.at(d)[static_cast<std::size_t>(it)]);
      sum += static_cast<double>(ccl.at(d)[static_cast<std::size_t>(it)]);
    }
    EXPECT_GE(slow.at(last)[static_cast<std::size_t>(it)], kSlowNs) << "iteration " << it;
    want_slow += static_cast<double>(mx) / kIterations;
    want_ccl += sum / mesh.size() / kIterations;
  }
  fmt::print(
      "slow_op: aggregated {:.1f} us, raw device {} iteration 0 {:.1f} us; all_reduce: "
      "aggregated {:.1f} us, expected mean from raw records {:.1f} us\n",
      a.ops[0].kernel_duration_us, last, slow.at(last)[0] / 1e3, a.ops[1].kernel_duration_us,
      want_ccl / 1e3);
  EXPECT_GE(a.ops[0].kernel_duration_us, kSlowNs / 1e3);
  // The same integer ns, divided in another order (by the devices, the iterations, 1e3): a few
  // ulps of durations far below 1e6 us (~1e-10 us).
  EXPECT_NEAR(a.ops[0].kernel_duration_us, want_slow / 1e3, 1e-6);
  EXPECT_NEAR(a.ops[1].kernel_duration_us, want_ccl / 1e3, 1e-6);
  EXPECT_NEAR(a.total_kernel_duration_us, (want_slow + want_ccl) / 1e3, 1e-6);
  if (mesh.size() > 1) {
    // The fast devices' all_reduce waited for the slow one, so the mean is not device 0's.
    EXPECT_NE(a.ops[1].kernel_duration_us * 1e3, static_cast<double>(ccl.at(0)[0]));
  }

  // The same figures come back from the report files.
  const test_support::TempDir tmp("perf_dist");  // rank 0's
  const auto root = tmp.path();
  const perf::ReportFiles f =
      perf::write_report(all, {.name = "slow", .root = root, .plot = false});
  const perf::Aggregate back = perf::aggregate(perf::read_ops_csv(f.csv).records);
  // The records come back as the same integer ns, aggregated by the same code.
  EXPECT_NEAR(back.ops[0].kernel_duration_us, a.ops[0].kernel_duration_us, 1e-9);
  EXPECT_NEAR(back.total_op_to_op_latency_us, a.total_op_to_op_latency_us, 1e-9);
  std::ifstream trace(f.trace);
  EXPECT_EQ(test_support::chrome_trace_problems(nlohmann::json::parse(trace)),
            std::vector<std::string>{});
  std::filesystem::remove_all(root);
}

TEST(PerfGather, EveryDeviceRecordsArriveAtRootInMeshOrder) {
  const MeshDevice mesh = MeshDevice::line();
  std::vector<perf::OpRecord> mine;
  for (int k = 0; k < mesh.device_id(); ++k) {  // device d has d records; device 0 none
    perf::OpRecord r;
    r.op_code = fmt::format("op{}", k);
    r.device_id = mesh.device_id();
    r.start_ns = k;
    r.end_ns = k + mesh.device_id();
    mine.push_back(r);
  }
  const int root = mesh.size() - 1;
  const auto all = gather_records(mesh, mine, root);
  if (mesh.device_id() != root) {
    EXPECT_TRUE(all.empty());
    return;
  }
  ASSERT_EQ(all.size(), static_cast<std::size_t>(mesh.size() * (mesh.size() - 1) / 2));
  std::size_t k = 0;
  for (int d = 0; d < mesh.size(); ++d) {
    for (int j = 0; j < d; ++j, ++k) {
      EXPECT_EQ(all[k].device_id, d);
      EXPECT_EQ(all[k].op_code, fmt::format("op{}", j));
      EXPECT_EQ(all[k].end_ns - all[k].start_ns, d);
    }
  }
}

TEST(PerfGather, BadRootFailsOnEveryDevice) {
  const MeshDevice mesh = MeshDevice::line();
  EXPECT_THROW(gather_records(mesh, {}, mesh.size()), Error);
  if (mesh.size() > 1) {
    // A root that differs between devices fails everywhere instead of hanging.
    EXPECT_THROW(gather_records(mesh, {}, mesh.device_id() == 0 ? 0 : 1), Error);
  }
}

TEST(PerfE2e, CountsCallsAndOrdersStatistics) {
  const MeshDevice mesh = MeshDevice::line();
  int calls = 0;
  const perf::E2eStats s = time_e2e(mesh, [&] { ++calls; }, {.warmup = 2, .iterations = 5});
  EXPECT_EQ(calls, 7);
  EXPECT_EQ(s.warmup, 2);
  EXPECT_EQ(s.iterations, 5);
  EXPECT_LE(s.min_us, s.mean_us);
  EXPECT_LE(s.mean_us, s.max_us);
  EXPECT_GE(s.std_us, 0);
  EXPECT_EQ(E2eOptions{}.warmup, 10);
  EXPECT_EQ(E2eOptions{}.iterations, 100);
  EXPECT_THROW(time_e2e(mesh, [] {}, {.warmup = 0, .iterations = 0}), Error);
  if (mesh.size() > 1) {
    EXPECT_THROW(time_e2e(mesh, [] {}, {.warmup = 1, .iterations = 2 + mesh.device_id()}), Error);
  }
}

}  // namespace
}  // namespace meshtest::dist
