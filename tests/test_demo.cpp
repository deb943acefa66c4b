// meshtest-demo run as a program under mpirun: at np 4 (default mesh 2x2) its gpt-oss section
// prints the aggregated per-op table and writes reports/demo/ (CSV of every device's records,
// measurements.json with e2e, a valid Chrome trace, ops.png); at np 3 (TP = 3 does not divide
// the heads) the section is skipped and nothing is written; the MoE section (expert parallel
// on axis 0, TP on axis 1) passes at both; a mesh that is not np exits 2.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "src/perf/ops_csv.hpp"
#include "src/perf/plot.hpp"
#include "tests/support/chrome_trace_check.hpp"
#include "tests/support/run_command.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest {
namespace {

namespace fs = std::filesystem;
using test_support::run_command;

/// Runs the demo under mpirun -np `np` (np = 0: directly, one rank) with its reports in `dir`.
test_support::CommandResult run_demo(int np, const fs::path& dir, const std::string& args = "") {
  const std::string launcher =
      np == 0 ? "" : fmt::format("mpirun --oversubscribe --allow-run-as-root -np {} ", np);
  return run_command(fmt::format("MESHTEST_REPORTS_DIR={} {}{} {}", dir.string(), launcher,
                                 MESHTEST_DEMO_BIN, args));
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

TEST(Demo, Np4ProfilesTheGptOssLayerAndWritesItsReports) {
  const test_support::TempDir dir("meshtest_demo");
  const auto r = run_demo(4, dir.path(), "--dtypes f32 --iters 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "transformer block, mesh 2x2: PCC")) << r.out;
  EXPECT_TRUE(has(r.out, "per-op perf on mesh 2x2 (4 devices): 2 warm-up + 10 measured")) << r.out;
  EXPECT_TRUE(has(r.out, "e2e per step (profiling off, 10 warm-up, 100 measured")) << r.out;
  // The MoE section: EP = 2 on axis 0, TP = 2 on axis 1, against one device, with and without
  // a capacity; each EP device's tokens and experts.
  EXPECT_TRUE(has(r.out,
                  "experts and tokens on axis 0 (EP = 2), each expert's units on axis 1 "
                  "(TP = 2)"))
      << r.out;
  EXPECT_TRUE(has(r.out, "MoE block expert parallel, mesh 2x2: max abs")) << r.out;
  EXPECT_TRUE(has(r.out,
                  "EP device 1 (mesh row 1, 2 TP devices): tokens [16, 32) (16), experts "
                  "4..7 (4; each TP device holds 12 of their 24 units)"))
      << r.out;
  EXPECT_TRUE(has(r.out, "  capacity factor 1: capacity 8 slots per expert, dropped")) << r.out;
  EXPECT_TRUE(has(r.out, "MoE EP check: PASS")) << r.out;

  // measurements.json: 4 devices, 10 iterations, the layer's ops (attention, then the MoE MLP),
  // the tensor-parallel all-reduces on axis 1 and the token gathers on axis 0 as CCLs.
  const fs::path demo = dir.path() / "demo";
  const nlohmann::json m = read_json(demo / "measurements.json");
  EXPECT_EQ(m["name"], "demo");
  EXPECT_EQ(m["devices"], 4);
  EXPECT_EQ(m["iterations"], 10);
  EXPECT_EQ(m["e2e"]["warmup"], 10);
  EXPECT_EQ(m["e2e"]["iterations"], 100);
  const nlohmann::json& ops = m["ops"];
  ASSERT_FALSE(ops.empty());
  EXPECT_EQ(ops[0]["op_code"], "rms_norm");
  int sdpa = -1, experts = -1, tp_reduces = 0, token_gathers = 0;
  for (const nlohmann::json& op : ops) {
    EXPECT_EQ(op["devices"], 4) << op.dump();
    const std::string code = op["op_code"], type = op["op_type"], attrs = op["attributes"];
    if (code == "sdpa") sdpa = op["index"];
    if (code == "moe_experts") experts = op["index"];
    if (type == "ccl" && code.starts_with("all_reduce") && has(attrs, "axis=1")) ++tp_reduces;
    if (type == "ccl" && code == "all_gather" && has(attrs, "axis=0")) ++token_gathers;
  }
  EXPECT_GE(sdpa, 0);
  EXPECT_GT(experts, sdpa);
  EXPECT_EQ(tp_reduces, 2);     // attention out projection, MoE second projection
  EXPECT_GE(token_gathers, 2);  // keys and values
  // The printed table is this aggregation: its total line holds the same figure.
  EXPECT_TRUE(has(r.out, fmt::format("{:.3f}", m["total_kernel_duration_us"].get<double>())))
      << r.out;

  // The CSV holds every device's records: per device 10 start/stop pairs and 2 warm-up + 10
  // measured iterations of the layer's ops.
  const perf::OpsReport csv = perf::read_ops_csv(demo / "ops_perf_demo.csv");
  std::map<int, int> signposts, records;
  for (const perf::OpRecord& rec : csv.records) {
    ++(rec.op_type == perf::OpType::signpost ? signposts : records)[rec.device_id];
  }
  ASSERT_EQ(records.size(), 4u);
  for (const auto& [device, n] : records) {
    EXPECT_EQ(signposts[device], 20) << "device " << device;
    EXPECT_EQ(n, 12 * static_cast<int>(ops.size())) << "device " << device;
  }

  const nlohmann::json trace = read_json(demo / "trace.json");
  EXPECT_EQ(test_support::chrome_trace_problems(trace), std::vector<std::string>{});
  std::set<int> pids;
  for (const nlohmann::json& e : trace["traceEvents"]) pids.insert(e["pid"].get<int>());
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2, 3}));
  if (!perf::find_gnuplot().empty()) {
    EXPECT_GT(fs::file_size(demo / "ops.png"), 0u);
  }
}

TEST(Demo, Np3SkipsTheGptOssLayerAndWritesNothing) {
  const test_support::TempDir dir("meshtest_demo");
  const auto r = run_demo(3, dir.path(), "--dtypes f32 --iters 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "mesh 1x3")) << r.out;
  EXPECT_TRUE(has(r.out, "skipped (no perf table, no reports): TP = 3")) << r.out;
  // The MoE section runs (its intermediate 24 splits over TP = 3; EP = 1 holds all 8 experts).
  EXPECT_TRUE(has(r.out, "MoE block expert parallel, mesh 1x3: max abs")) << r.out;
  EXPECT_TRUE(has(r.out,
                  "EP device 0 (mesh row 0, 3 TP devices): tokens [0, 32) (32), experts "
                  "0..7 (8; each TP device holds 8 of their 24 units)"))
      << r.out;
  EXPECT_TRUE(has(r.out, "MoE EP check: PASS")) << r.out;
  EXPECT_FALSE(fs::exists(dir.path() / "demo"));
}

TEST(Demo, MeshOfAnotherSizeExits2) {
  const test_support::TempDir dir("meshtest_demo");
  const auto r = run_demo(0, dir.path(), "--mesh 2x4");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_TRUE(has(r.out, "--mesh 2x4 has 8 devices but mpirun started 1 ranks")) << r.out;
}

}  // namespace
}  // namespace meshtest
