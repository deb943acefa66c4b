// The ops_perf CSV: columns, W/Z/Y/X alignment, quoting, exact round trip, and every bad input.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/perf/aggregate.hpp"
#include "src/perf/ops_csv.hpp"
#include "tests/support/expect_error.hpp"
#include "tests/support/perf_records.hpp"

namespace meshtest::perf {
namespace test_perf_csv {

using test_support::expect_error;
using test_support::op_spec;
using test_support::profiled_run;

std::vector<OpRecord> sample_ops() {
  const TensorInfo x{.shape = {32, 64}, .dtype = DType::bf16, .memory = "Shard(1)"};
  const TensorInfo w{.shape = {128, 64}, .dtype = DType::f32, .memory = "Replicate"};
  const TensorInfo y{.shape = {2, 3, 4, 5, 6}, .dtype = DType::f32, .memory = "DEVICE"};
  return {op_spec("linear", {x, w}, {y}, "bias=false"),
          op_spec("all_gather", {x}, {x}, "axis=1;dim=0", OpType::ccl),
          op_spec("cat", {y}, {y}, "dims=(0, 1);note=\"q\"")};
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == '\n')
      out.push_back(std::exchange(cur, {}));
    else
      cur += c;
  }
  return out;
}

TEST(PerfCsv, WzyxRightAlignsAndFoldsExtraDims) {
  EXPECT_EQ(wzyx(Shape{32, 64}), (std::array<std::int64_t, 4>{1, 1, 32, 64}));
  EXPECT_EQ(wzyx(Shape{}), (std::array<std::int64_t, 4>{1, 1, 1, 1}));
  EXPECT_EQ(wzyx(Shape{2, 3, 4, 5}), (std::array<std::int64_t, 4>{2, 3, 4, 5}));
  EXPECT_EQ(wzyx(Shape{2, 3, 4, 5, 6}), (std::array<std::int64_t, 4>{6, 4, 5, 6}));
}

TEST(PerfCsv, HeaderAndRowsAsDesigned) {
  const auto recs = profiled_run(2, sample_ops(), 1);
  const auto l = lines(ops_csv(recs));
  ASSERT_EQ(l.size(), 1 + recs.size());
  EXPECT_EQ(l[0],
            "OP CODE,OP TYPE,GLOBAL CALL COUNT,DEVICE ID,ATTRIBUTES,DEVICE KERNEL DURATION "
            "[ns],OP TO OP LATENCY [ns],"
            "INPUT_0_W,INPUT_0_Z,INPUT_0_Y,INPUT_0_X,INPUT_0_DATATYPE,INPUT_0_MEMORY,"
            "INPUT_1_W,INPUT_1_Z,INPUT_1_Y,INPUT_1_X,INPUT_1_DATATYPE,INPUT_1_MEMORY,"
            "OUTPUT_0_W,OUTPUT_0_Z,OUTPUT_0_Y,OUTPUT_0_X,OUTPUT_0_DATATYPE,OUTPUT_0_MEMORY");
  // Device 0's first measured op: the linear after the warm-up ops and the start signpost.
  // Durations 100 (linear), 200, 300; 5 ns gaps; the signpost is not an op, so the latency
  // is 5 + 0 + 5 = 10 ns after the warm-up cat.
  EXPECT_EQ(l[5],
            "linear,compute,5,0,bias=false,100,10,1,1,32,64,bf16,Shard(1),1,1,128,64,f32,"
            "Replicate,6,4,5,6,f32,DEVICE");
  EXPECT_EQ(l[4], "signpost,signpost,4,0,start,0,5,,,,,,,,,,,,,,,,,,");
  // Quoted cells: a comma and quotes inside the attributes.
  EXPECT_EQ(l[7].substr(0, 44), "cat,compute,7,0,\"dims=(0, 1);note=\"\"q\"\"\",300");
  // Device 1 rows follow device 0's; its ops last 10 ns longer.
  EXPECT_EQ(l[13].substr(0, 36), "linear,compute,5,1,bias=false,110,10");
}

TEST(PerfCsv, RoundTripKeepsFieldsDurationsAndLatencies) {
  const auto recs = profiled_run(3, sample_ops(), 2);
  const OpsReport rep = parse_ops_csv(ops_csv(recs), "mem.csv");
  ASSERT_EQ(rep.records.size(), recs.size());
  const auto t0 = op_timings(recs), t1 = op_timings(rep.records);
  for (std::size_t k = 0; k < recs.size(); ++k) {
    const OpRecord &a = recs[k], &b = rep.records[k];
    EXPECT_EQ(a.op_code, b.op_code);
    EXPECT_EQ(a.op_type, b.op_type);
    EXPECT_EQ(a.device_id, b.device_id);
    EXPECT_EQ(a.global_call_count, b.global_call_count);
    EXPECT_EQ(a.attributes, b.attributes);
    EXPECT_EQ(tensor_fields(a), tensor_fields(b));
    EXPECT_EQ(t0[k].kernel_ns, t1[k].kernel_ns);
    EXPECT_EQ(t0[k].op_to_op_ns, t1[k].op_to_op_ns);
    EXPECT_EQ(rep.lines[k], k + 2);
  }
  EXPECT_EQ(aggregate(recs).total_kernel_duration_us,
            aggregate(rep.records).total_kernel_duration_us);
}

TEST(PerfCsv, BadInputsAreClearErrors) {
  const std::string good = ops_csv(profiled_run(2, sample_ops(), 1));
  const auto replace = [&](std::string from, std::string to) {
    std::string s = good;
    for (auto p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) {
      s.replace(p, from.size(), to);
    }
    return s;
  };
  expect_error([] { parse_ops_csv("", "e.csv"); }, {"e.csv", "empty report"});
  expect_error([&] { parse_ops_csv(good.substr(0, good.find('\n') + 1), "h.csv"); },
               {"h.csv", "empty report: a header but no rows"});
  expect_error([&] { parse_ops_csv(replace("OP TO OP LATENCY [ns]", "LATENCY"), "m.csv"); },
               {"m.csv", "missing column 'OP TO OP LATENCY [ns]'"});
  expect_error([&] { parse_ops_csv(replace("INPUT_1_MEMORY", "INPUT_1_MEM"), "g.csv"); },
               {"missing column 'INPUT_1_MEMORY'"});
  expect_error([&] { parse_ops_csv(replace(",compute,", ",kernel,"), "t.csv"); },
               {"t.csv", "line 2", "unknown op type 'kernel'"});
  expect_error([&] { parse_ops_csv(replace(",start,", ",begin,"), "s.csv"); },
               {"s.csv", "no \"start\" signpost"});
  expect_error([&] { parse_ops_csv(replace(",bf16,", ",f8,"), "d.csv"); },
               {"d.csv", "line 2", "INPUT_0", "f8"});
  expect_error([&] { parse_ops_csv(replace(",1,1,32,64,bf16,", ",1,1,-32,64,bf16,"), "neg.csv"); },
               {"neg.csv", "line 2", "INPUT_0"});
  expect_error([&] { parse_ops_csv(replace(",Shard(1),", ",,"), "p.csv"); },
               {"INPUT_0 is partly empty"});
  expect_error([&] { parse_ops_csv(replace(",bias=false,100,", ",bias=false,1e2,"), "n.csv"); },
               {"line 2", "DEVICE KERNEL DURATION [ns]", "'1e2'"});
  expect_error([&] { parse_ops_csv(replace(",bias=false,", ",bias=false,,"), "c.csv"); },
               {"26 cells, the header has 25"});
  expect_error([&] { parse_ops_csv(good + "\"open", "q.csv"); }, {"unterminated"});
  // Mismatched device counts: device 1 lost the measured linear row.
  std::string s = good;
  const auto row = s.find("linear,compute,5,1,");
  s.erase(row, s.find('\n', row) + 1 - row);
  expect_error([&] { parse_ops_csv(s, "x.csv"); },
               {"x.csv", "device 1 runs 2 ops in iteration 0", "device 0 runs 3"});
  expect_error([] { read_ops_csv("/nonexistent/ops.csv"); }, {"cannot read '/nonexistent"});
}

TEST(PerfCsv, TimesThatOverflowInt64AreErrors) {
  // Start and end times are sums of the durations and latencies before them.
  const std::string good = ops_csv(profiled_run(1, sample_ops(), 1));
  const std::string row = "linear,compute,5,0,bias=false,100,";
  std::string s = good;
  const auto at = s.find(row);
  ASSERT_NE(at, std::string::npos) << s;
  s.replace(at, row.size(), "linear,compute,5,0,bias=false,9223372036854775807,");
  expect_error([&] { parse_ops_csv(s, "o.csv"); },
               {"o.csv: line 6: device 0's durations and latencies", "sum past the int64 range"});
}

}  // namespace test_perf_csv
}  // namespace meshtest::perf
