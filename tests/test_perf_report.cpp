// Report files: trace.json validated as Chrome trace-event JSON, measurements.json, e2e
// statistics, the record codec, and reports/<name>/ written whole.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "src/perf/chrome_trace.hpp"
#include "src/perf/measurements.hpp"
#include "src/perf/ops_csv.hpp"
#include "src/perf/plot.hpp"
#include "src/perf/record_codec.hpp"
#include "src/perf/report.hpp"
#include "tests/support/chrome_trace_check.hpp"
#include "tests/support/expect_error.hpp"
#include "tests/support/perf_records.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest::perf {
namespace test_perf_report {

using nlohmann::json;
using test_support::chrome_trace_problems;
using test_support::expect_error;
using test_support::op_spec;
using test_support::profiled_run;

std::vector<OpRecord> sample_run(int devices = 2, int iterations = 2) {
  const TensorInfo x{.shape = {8, 16}, .dtype = DType::f32, .memory = "Shard(0)"};
  return profiled_run(devices,
                      {op_spec("rms_norm", {x}, {x}, "eps=1e-05"),
                       op_spec("all_reduce", {x}, {x}, "axis=all;op=sum", OpType::ccl)},
                      iterations);
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(PerfReport, TraceIsChromeTraceJsonWithOneProcessPerDevice) {
  const auto recs = sample_run(3, 2);
  const json j = json::parse(chrome_trace_json(recs));
  EXPECT_EQ(chrome_trace_problems(j), std::vector<std::string>{});
  std::map<std::int64_t, int> x_per_pid;
  std::map<std::int64_t, std::string> names;
  for (const json& e : j["traceEvents"]) {
    if (e["ph"] == "X") ++x_per_pid[e["pid"].get<std::int64_t>()];
    if (e["name"] == "process_name") names[e["pid"]] = e["args"]["name"];
  }
  // 3 devices, each: 2 warm-up ops + 2 iterations x 2 ops.
  EXPECT_EQ(x_per_pid, (std::map<std::int64_t, int>{{0, 6}, {1, 6}, {2, 6}}));
  EXPECT_EQ(names, (std::map<std::int64_t, std::string>{
                       {0, "device 0"}, {1, "device 1"}, {2, "device 2"}}));
  // The first record starts at 1000 ns on every device: ts 0; rms_norm on device 2 lasts
  // 100 + 20 ns = 0.12 us.
  for (const json& e : j["traceEvents"]) {
    if (e["ph"] == "X" && e["pid"] == 2) {
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 0.0);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 0.12);
      EXPECT_EQ(e["cat"], "compute");
      break;
    }
  }
  // The validator itself rejects broken traces.
  json broken = j;
  broken["traceEvents"][0]["args"]["name"] = 3;
  broken["traceEvents"].push_back({{"ph", "X"}, {"name", "a"}, {"pid", 9}, {"tid", 0}});
  EXPECT_EQ(chrome_trace_problems(broken).size(), 2u);
  expect_error([] { chrome_trace_json({}); }, {"no op records"});
}

TEST(PerfReport, OpsTimedOnAGpuGoOnTheDevicesGpuTrack) {
  auto recs = sample_run(2, 1);
  recs[0].timed_on_device = true;  // device 0's first op, timed by CUDA events
  const json j = json::parse(chrome_trace_json(recs));
  EXPECT_EQ(chrome_trace_problems(j), std::vector<std::string>{});
  std::map<std::pair<std::int64_t, std::int64_t>, std::string> threads;  // (pid, tid) -> name
  std::map<std::int64_t, int> gpu_ops;                                   // pid -> X events on 1
  for (const json& e : j["traceEvents"]) {
    if (e["name"] == "thread_name") threads[{e["pid"], e["tid"]}] = e["args"]["name"];
    if (e["ph"] == "X" && e["tid"] == 1) ++gpu_ops[e["pid"].get<std::int64_t>()];
  }
  using Track = std::pair<std::int64_t, std::int64_t>;
  EXPECT_EQ(threads, (std::map<Track, std::string>{
                         {{0, 0}, "ops"}, {{0, 1}, "gpu (device time)"}, {{1, 0}, "ops"}}));
  EXPECT_EQ(gpu_ops, (std::map<std::int64_t, int>{{0, 1}}));
}

TEST(PerfReport, E2eStatsByHand) {
  const std::vector<double> t = {2, 4, 4, 4, 5, 5, 7, 9};  // mean 5, population std 2
  const E2eStats s = e2e_stats(t, 10);
  EXPECT_EQ(s.warmup, 10);
  EXPECT_EQ(s.iterations, 8);
  EXPECT_DOUBLE_EQ(s.mean_us, 5);
  EXPECT_DOUBLE_EQ(s.min_us, 2);
  EXPECT_DOUBLE_EQ(s.max_us, 9);
  EXPECT_DOUBLE_EQ(s.std_us, 2);
  // Equal times: the rounded sum / n (0.007000000000000001) must not exceed the max.
  const E2eStats same = e2e_stats(std::vector<double>(5, 0.007), 0);
  EXPECT_EQ(same.mean_us, 0.007);
  EXPECT_LE(same.mean_us, same.max_us);
  expect_error([] { e2e_stats({}, 0); }, {"no measured iterations"});
  const std::vector<double> nan = {1, std::nan("")};
  expect_error([&] { e2e_stats(nan, 0); }, {"finite"});
}

TEST(PerfReport, MeasurementsJsonCarriesTotalsAndOps) {
  // sample_run has one start/stop pair around both iterations.
  const Aggregate a = aggregate(sample_run(), {.iterations = 2});
  const json j = json::parse(measurements_json("x", a, e2e_stats(std::vector<double>{1, 3}, 2)));
  // rms_norm: slowest device 1 lasts 110 ns; all_reduce: mean of 200 and 210 ns.
  EXPECT_DOUBLE_EQ(j["ops"][0]["kernel_duration_us"].get<double>(), 0.110);
  EXPECT_DOUBLE_EQ(j["ops"][1]["kernel_duration_us"].get<double>(), 0.205);
  EXPECT_DOUBLE_EQ(j["total_kernel_duration_us"].get<double>(), 0.110 + 0.205);
  // rms_norm: 5 + 5 ns after the warm-up all_reduce (the signpost between is not an op) in
  // iteration 0, 5 ns in iteration 1 -> 7.5 ns; all_reduce 5 ns -> total 12.5 ns.
  EXPECT_DOUBLE_EQ(j["total_op_to_op_latency_us"].get<double>(), 0.0125);
  EXPECT_EQ(j["ops"][1]["op_type"], "ccl");
  EXPECT_EQ(j["devices"], 2);
  EXPECT_EQ(j["iterations"], 2);
  EXPECT_DOUBLE_EQ(j["e2e"]["mean_us"].get<double>(), 2.0);
  EXPECT_FALSE(json::parse(measurements_json("x", a)).contains("e2e"));
}

TEST(PerfReport, RecordCodecRoundTrips) {
  auto recs = sample_run(2, 1);
  recs[3].bytes = 4096;
  recs[3].flops = 1.5e9;
  recs[2].timed_on_device = true;
  const auto bytes = encode_records(recs);
  const auto back = decode_records(bytes);
  ASSERT_EQ(back.size(), recs.size());
  for (std::size_t k = 0; k < recs.size(); ++k) {
    EXPECT_EQ(back[k].op_code, recs[k].op_code);
    EXPECT_EQ(back[k].op_type, recs[k].op_type);
    EXPECT_EQ(back[k].device_id, recs[k].device_id);
    EXPECT_EQ(back[k].global_call_count, recs[k].global_call_count);
    EXPECT_EQ(back[k].attributes, recs[k].attributes);
    EXPECT_EQ(back[k].inputs, recs[k].inputs);
    EXPECT_EQ(back[k].outputs, recs[k].outputs);
    EXPECT_EQ(back[k].start_ns, recs[k].start_ns);
    EXPECT_EQ(back[k].end_ns, recs[k].end_ns);
    EXPECT_EQ(back[k].bytes, recs[k].bytes);
    EXPECT_EQ(back[k].flops, recs[k].flops);
    EXPECT_EQ(back[k].timed_on_device, recs[k].timed_on_device);
  }
  const std::vector<std::uint8_t> junk = {0xff, 0x00, 0x13};
  expect_error([&] { decode_records(junk); }, {"not encoded op records"});
}

TEST(PerfReport, WritesEveryFileIntoReportsName) {
  const test_support::TempDir tmp("perf_report");
  const auto root = tmp.path();
  const auto recs = sample_run();
  const ReportFiles f = write_report(recs, {.name = "unit", .root = root});
  EXPECT_EQ(f.csv, root / "unit" / "ops_perf_unit.csv");
  EXPECT_EQ(parse_ops_csv(slurp(f.csv)).records.size(), recs.size());
  EXPECT_EQ(json::parse(slurp(f.measurements))["name"], "unit");
  EXPECT_EQ(chrome_trace_problems(json::parse(slurp(f.trace))), std::vector<std::string>{});
  if (find_gnuplot().empty()) {
    EXPECT_NE(f.plot_note.find("gnuplot not found"), std::string::npos);
  } else {
    // A PNG file starts with the 8-byte PNG signature.
    EXPECT_EQ(slurp(f.plot).substr(0, 8), "\x89PNG\r\n\x1a\n");
  }
  // No temp files are left beside the reports.
  for (const auto& e : std::filesystem::directory_iterator(root / "unit")) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
  expect_error([&] { write_report(recs, {.name = "../x", .root = root}); }, {"report name"});
  expect_error([&] { write_report({}, {.name = "y", .root = root}); }, {"no op records"});
  std::filesystem::remove_all(root);
}

TEST(PerfReport, CclBenchJsonForms) {
  const std::string row =
      R"({"op":"all_reduce","bytes":65536,"dtype":"f32","np":2,"time_us":30.5,"algbw":2.1,)"
      R"("busbw":2.1,"wrong":0,"mpi_time_us":31,"mpi_busbw":2.0,"ratio":0.98})";
  EXPECT_EQ(parse_ccl_bench_json("[" + row + "," + row + "]", "a").size(), 2u);
  EXPECT_EQ(parse_ccl_bench_json(R"({"rows":[)" + row + "]}", "b").size(), 1u);
  EXPECT_EQ(parse_ccl_bench_json(row + "\n" + row + "\n", "c")[1].mpi_busbw, 2.0);
  std::string missing = row;
  missing.erase(missing.find(R"("mpi_busbw":2.0,)"), 16);
  expect_error([&] { parse_ccl_bench_json(missing, "m.json"); },
               {"m.json: row 0", "'mpi_busbw' missing"});
  expect_error([] { parse_ccl_bench_json("[]", "e.json"); }, {"no bench rows"});
  expect_error([] { parse_ccl_bench_json("{oops\n", "j.json"); }, {"j.json", "not JSON"});
}

TEST(PerfReport, CclBenchJsonLimits) {
  const std::string row =
      R"({"op":"all_reduce","bytes":BYTES,"dtype":"f32","np":NP,"time_us":30.5,"algbw":2.1,)"
      R"("busbw":2.1,"wrong":0,"mpi_time_us":31,"mpi_busbw":2.0,"ratio":0.98})";
  const auto with = [&](const std::string& bytes, const std::string& np) {
    std::string r = row;
    r.replace(r.find("BYTES"), 5, bytes);
    return r.replace(r.find("NP"), 2, np);
  };
  EXPECT_EQ(parse_ccl_bench_json(with("2048.0", "4"), "f.json")[0].bytes, 2048);
  // Integer fields must be whole numbers that fit: a cast of 1e300 to int64 is undefined.
  expect_error([&] { parse_ccl_bench_json(with("1e300", "2"), "b.json"); },
               {"b.json: row 0",
                "'bytes' must be an integer in [-9223372036854775808, "
                "9223372036854775807], got 1e+300"});
  expect_error([&] { parse_ccl_bench_json(with("64", "1e10"), "n.json"); },
               {"'np' must be an integer in [-2147483648, 2147483647]"});
  expect_error([&] { parse_ccl_bench_json(with("64", "2.5"), "h.json"); },
               {"'np' must be an integer", "2.5"});
  // A number beyond double is nlohmann's out_of_range, not a parse_error: still an Error.
  expect_error([&] { parse_ccl_bench_json(with("1e+3000", "2"), "o.json"); },
               {"o.json", "not JSON", "line 1", "number overflow parsing '1e+3000'"});
  // Nesting deeper than kMaxJsonDepth, as a document and as JSON lines.
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  expect_error([&] { parse_ccl_bench_json(deep, "d.json"); }, {"d.json", "more than 64 deep"});
  expect_error([&] { parse_ccl_bench_json(with("64", "2") + "\n" + deep + "\n", "l.json"); },
               {"l.json", "more than 64 deep"});
}

}  // namespace test_perf_report
}  // namespace meshtest::perf
