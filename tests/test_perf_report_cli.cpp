// meshtest-report run as a program: compare catches a changed shape, dtype and attribute and
// reports no-match and ambiguous; shapes and summary; every bad input exits 2 with a message.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "src/perf/aggregate.hpp"
#include "src/perf/measurements.hpp"
#include "src/perf/ops_csv.hpp"
#include "src/perf/plot.hpp"
#include "src/perf/report.hpp"
#include "tests/support/perf_records.hpp"
#include "tests/support/run_command.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest::perf {
namespace {

using test_support::op_spec;
using test_support::profiled_run;

namespace fs = std::filesystem;

using CliRun = test_support::CommandResult;

CliRun run(const std::string& args, const std::string& env = "") {
  return test_support::run_command(env + " " + MESHTEST_REPORT_BIN + " " + args);
}

const TensorInfo kX{.shape = {1, 32, 2880}, .dtype = DType::bf16, .memory = "Replicate"};
const TensorInfo kW{.shape = {2880, 720}, .dtype = DType::bf16, .memory = "Shard(1)"};
const TensorInfo kY{.shape = {1, 32, 720}, .dtype = DType::bf16, .memory = "Shard(2)"};

// The fused op under test: linear -> add bias -> all_gather.
std::vector<OpRecord> fused() {
  return {op_spec("linear", {kX, kW}, {kY}, "transpose_b=true"), op_spec("add", {kY, kY}, {kY}),
          op_spec("all_gather", {kY}, {kX}, "axis=1;dim=2", OpType::ccl)};
}

// The module: rms_norm, the fused sequence, then a residual add.
std::vector<OpRecord> module_ops() {
  std::vector<OpRecord> m = {op_spec("rms_norm", {kX}, {kX}, "eps=1e-05")};
  for (OpRecord& r : fused()) m.push_back(r);
  m.push_back(op_spec("add", {kX, kX}, {kX}));
  return m;
}

class ReportCli : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::vector<OpRecord>& recs) {
    return write_text(name, ops_csv(recs));
  }
  std::string write_text(const std::string& name, const std::string& text) {
    write_text_atomic(dir_ / name, text);
    return (dir_ / name).string();
  }
  /// Runs compare of `unit` against a 2-device module run of `ops` and expects exit 1 and
  /// every message part.
  void expect_compare_fails(const std::string& unit, const std::string& name,
                            const std::vector<OpRecord>& ops,
                            const std::vector<std::string>& parts) {
    const CliRun r = run(fmt::format("compare {} {}", unit, write(name, profiled_run(2, ops, 1))));
    EXPECT_EQ(r.status, 1) << r.out;
    for (const std::string& p : parts) EXPECT_NE(r.out.find(p), std::string::npos) << r.out;
  }
  test_support::TempDir tmp_{"report_cli"};
  fs::path dir_ = tmp_.path();
};

TEST_F(ReportCli, HelpAndUsage) {
  EXPECT_EQ(run("--help").status, 0);
  EXPECT_NE(run("--help").out.find("compare"), std::string::npos);
  EXPECT_EQ(run("compare --help").status, 0);
  EXPECT_EQ(run("").status, 2);
  const CliRun r = run("frobnicate");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("unknown command 'frobnicate'"), std::string::npos) << r.out;
  EXPECT_EQ(run("compare only_one.csv").status, 2);
  EXPECT_EQ(run("summary x.csv --bogus").status, 2);
}

TEST_F(ReportCli, CompareMatchesUniqueSubsequence) {
  const std::string unit = write("unit.csv", profiled_run(4, fused(), 3));
  const std::string module = write("module.csv", profiled_run(4, module_ops(), 1));
  const CliRun r = run(fmt::format("compare --unit-iterations 3 {} {}", unit, module));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("OK: the unit test's 3 ops match module ops 1..3"), std::string::npos)
      << r.out;
  // Without --unit-iterations the unit's one start/stop pair holds 9 ops: no match.
  const CliRun whole = run(fmt::format("compare {} {}", unit, module));
  EXPECT_EQ(whole.status, 1);
  EXPECT_NE(whole.out.find("no matching subsequence"), std::string::npos) << whole.out;
  EXPECT_NE(whole.out.find("pass --unit-iterations N"), std::string::npos) << whole.out;
}

TEST_F(ReportCli, CompareNamesChangedShapeDtypeAndAttribute) {
  const std::string unit = write("unit.csv", profiled_run(2, fused(), 1));
  auto m = module_ops();
  m[1].inputs[0].shape = Shape{1, 64, 2880};  // linear's activation: Y 32 -> 64
  // Module device 0: 5 warm-up ops, the start signpost, rms_norm, then linear on line 9.
  expect_compare_fails(unit, "m1.csv", m,
                       {"op 0 'linear' (" + unit + " line 6 / " + (dir_ / "m1.csv").string() +
                            " line 9): INPUT_0_Y: unit '32', module '64'",
                        "FAIL: the unit test's 3 ops match module ops 1..3"});
  m = module_ops();
  m[3].outputs[0].dtype = DType::f32;  // all_gather's output
  expect_compare_fails(unit, "m2.csv", m,
                       {"op 2 'all_gather'", "OUTPUT_0_DATATYPE: unit 'bf16', module 'f32'"});
  m = module_ops();
  m[3].attributes = "axis=0;dim=2";
  expect_compare_fails(unit, "m3.csv", m,
                       {"ATTRIBUTES: unit 'axis=1;dim=2', module 'axis=0;dim=2'"});
  m = module_ops();
  m[2].inputs[1].memory = "L1";  // the placement counts too
  expect_compare_fails(unit, "m4.csv", m, {"INPUT_1_MEMORY: unit 'Shard(2)', module 'L1'"});
}

TEST_F(ReportCli, CompareNoMatchAndAmbiguous) {
  const std::string unit = write("unit.csv", profiled_run(2, fused(), 1));
  auto m = module_ops();
  m.erase(m.begin() + 2);  // the module lost the bias add
  expect_compare_fails(unit, "none.csv", m,
                       {"no matching subsequence: the unit test's 3 ops (linear, add, "
                        "all_gather) do not occur contiguously"});
  m = module_ops();
  for (const OpRecord& r : fused()) m.push_back(r);  // a second layer with the same sequence
  expect_compare_fails(unit, "two.csv", m,
                       {"ambiguous: the unit test's 3 ops (linear, add, all_gather) occur 2 "
                        "times"});
}

TEST_F(ReportCli, ShapesSingleAgainstDeviceZero) {
  std::vector<OpRecord> ops = {op_spec("linear", {kX, kW}, {kY}), op_spec("add", {kY, kY}, {kY})};
  const std::string single = write("single.csv", profiled_run(1, ops, 2));
  const std::string multi = write("multi.csv", profiled_run(4, ops, 2));
  const CliRun ok = run(fmt::format("shapes {} {}", single, multi));
  EXPECT_EQ(ok.status, 0) << ok.out;
  EXPECT_NE(ok.out.find("OK: 4 ops"), std::string::npos) << ok.out;
  ops[1].outputs[0].shape = Shape{1, 32, 1440};
  const CliRun bad =
      run(fmt::format("shapes {} {}", single, write("m2.csv", profiled_run(4, ops, 2))));
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.out.find("op 1 'add'"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("OUTPUT_0_X: single 720, multi 1440"), std::string::npos) << bad.out;
  ops.pop_back();
  const CliRun fewer =
      run(fmt::format("shapes {} {}", write("s1.csv", profiled_run(1, ops, 1)), multi));
  EXPECT_EQ(fewer.status, 1);
  EXPECT_NE(fewer.out.find("op counts differ: single-device run 1 op (linear), multi-device "
                           "device 0 4 ops"),
            std::string::npos)
      << fewer.out;
  const CliRun two = run(fmt::format("shapes {} {}", multi, single));
  EXPECT_EQ(two.status, 2);
  EXPECT_NE(two.out.find("must hold 1 device, it holds 4"), std::string::npos) << two.out;
}

TEST_F(ReportCli, SummaryPrintsAggregatedTable) {
  // Two devices, 2 iterations of (linear 100/110 ns, add 200/210 ns, all_gather 300/310 ns):
  // linear 0.110, add 0.210 (slowest device), all_gather 0.305 us (mean) -> total 0.625 us.
  const std::string csv = write("s.csv", profiled_run(2, fused(), 2));
  const CliRun r = run(fmt::format("summary --iterations 2 {}", csv));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("total_kernel_duration_us = 0.625"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 devices, 2 measured iterations, 3 ops per iteration"), std::string::npos)
      << r.out;
}

TEST_F(ReportCli, BadInputsExitTwoWithAMessage) {
  const std::string good = ops_csv(profiled_run(2, fused(), 1));
  const std::string module = write("module.csv", profiled_run(2, module_ops(), 1));
  const auto expect_bad = [&](const std::string& name, const std::string& text,
                              const std::string& message) {
    const std::string path = write_text(name, text);
    for (const std::string& cmd :
         {"compare " + path + " " + module, "summary " + path, "shapes " + path + " " + module}) {
      const CliRun r = run(cmd);
      EXPECT_EQ(r.status, 2) << cmd << "\n" << r.out;
      EXPECT_NE(r.out.find("meshtest-report: error: "), std::string::npos) << r.out;
      EXPECT_NE(r.out.find(message), std::string::npos) << cmd << "\n" << r.out;
    }
  };
  const auto edit = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    for (auto p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) {
      s.replace(p, from.size(), to);
    }
    return s;
  };
  expect_bad("missing_col.csv", edit("DEVICE ID", "DEV"), "missing column 'DEVICE ID'");
  expect_bad("unknown_type.csv", edit(",ccl,", ",collective,"), "unknown op type 'collective'");
  expect_bad("no_signposts.csv", edit(",signpost,", ",compute,"), "no \"start\" signpost");
  expect_bad("empty.csv", "", "empty report");
  expect_bad("header_only.csv", good.substr(0, good.find('\n') + 1), "empty report");
  std::string fewer = good;
  const auto row = fewer.find("add,compute,6,1,");
  fewer.erase(row, fewer.find('\n', row) + 1 - row);
  expect_bad("devices.csv", fewer, "device 1 runs 2 ops in iteration 0");
  const CliRun missing = run("summary " + (dir_ / "nope.csv").string());
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.out.find("cannot read"), std::string::npos) << missing.out;
  const CliRun bad_iter = run("summary --iterations 2 " + module);
  EXPECT_EQ(bad_iter.status, 2);
  EXPECT_NE(bad_iter.out.find("do not split into 2"), std::string::npos) << bad_iter.out;
}

TEST_F(ReportCli, CheckPerfFailsOnARegressionAndUpdatesTheExpectation) {
  // A run and the same run 20 % slower, through the real report writer.
  const std::vector<OpRecord> base = profiled_run(2, fused(), 4);
  std::vector<OpRecord> slow = base;
  for (OpRecord& r : slow) {  // every time 1.2x: kernels and the gaps between them
    r.start_ns = r.start_ns * 6 / 5;
    r.end_ns = r.end_ns * 6 / 5;
  }
  const auto measure = [&](const std::string& name, const std::vector<OpRecord>& recs) {
    return write_text(name, measurements_json("fused", aggregate(recs, {.iterations = 4})));
  };
  const std::string expected = measure("expected.json", base);
  const std::string same = measure("same.json", base);
  const std::string slower = measure("slower.json", slow);
  const CliRun ok = run(fmt::format("check-perf {} {}", expected, same));
  EXPECT_EQ(ok.status, 0) << ok.out;
  EXPECT_NE(ok.out.find("0 of 5 rows slower"), std::string::npos) << ok.out;
  const CliRun bad = run(fmt::format("check-perf {} {}", expected, slower));
  EXPECT_EQ(bad.status, 1) << bad.out;
  EXPECT_NE(bad.out.find("REGRESSION"), std::string::npos) << bad.out;
  EXPECT_EQ(run(fmt::format("check-perf {} {} --margin 0.25", expected, slower)).status, 0);
  // --update takes the slower run as the expectation (with its margin), then it passes.
  const CliRun up = run(fmt::format("check-perf {} {} --update --margin 0.05", expected, slower));
  EXPECT_EQ(up.status, 0) << up.out;
  EXPECT_NE(up.out.find("wrote " + expected), std::string::npos) << up.out;
  EXPECT_EQ(run(fmt::format("check-perf {} {}", expected, slower)).status, 0);
  // Bad input: a missing file, a CSV instead of JSON, another op sequence.
  EXPECT_EQ(run(fmt::format("check-perf {}/none.json {}", dir_.string(), same)).status, 2);
  const CliRun csv = run(fmt::format("check-perf {} {}", write("r.csv", base), same));
  EXPECT_EQ(csv.status, 2);
  EXPECT_NE(csv.out.find("not JSON"), std::string::npos) << csv.out;
  const std::string other = measure("other.json", profiled_run(2, module_ops(), 4));
  const CliRun seq = run(fmt::format("check-perf {} {}", expected, other));
  EXPECT_EQ(seq.status, 2);
  EXPECT_NE(seq.out.find("not the same op sequence"), std::string::npos) << seq.out;
}

TEST_F(ReportCli, PlotsNeedGnuplot) {
  const std::string json = write_text(
      "bench.json",
      R"([{"op":"all_reduce","bytes":65536,"dtype":"f32","np":2,"time_us":30.5,"algbw":2.1,)"
      R"("busbw":2.1,"wrong":0,"mpi_time_us":31,"mpi_busbw":2.0,"ratio":0.98}])");
  const CliRun r = run("plot-ccl " + json + " " + (dir_ / "ccl.png").string(), "PATH=/nonexistent");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("gnuplot not found on PATH"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gnuplot-nox"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "ccl.png"));
  const CliRun bad = run("plot-ccl " + write_text("bad.json", "[{\"op\": 1}]") + " x.png");
  EXPECT_EQ(bad.status, 2);
  if (!find_gnuplot().empty()) {
    const CliRun ok = run("plot-ccl " + json + " " + (dir_ / "ccl.png").string());
    EXPECT_EQ(ok.status, 0) << ok.out;
    EXPECT_TRUE(fs::exists(dir_ / "ccl.png"));
  }
}

}  // namespace
}  // namespace meshtest::perf
