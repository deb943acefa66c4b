// Aggregation of hand-made records: max over devices for compute, mean for CCLs, average over
// iterations, totals worked out by hand; and every malformed-input error.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "src/perf/aggregate.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::perf {
namespace test_perf_aggregate {

using test_support::expect_error;

OpRecord op(int dev, std::string code, OpType type, std::int64_t start, std::int64_t end) {
  OpRecord r;
  r.op_code = std::move(code);
  r.op_type = type;
  r.device_id = dev;
  r.attributes = type == OpType::ccl ? "axis=1;dim=0" : "";
  r.start_ns = start;
  r.end_ns = end;
  return r;
}
OpRecord sign(int dev, std::string name, std::int64_t t) {
  OpRecord r = op(dev, "signpost", OpType::signpost, t, t);
  r.attributes = std::move(name);
  return r;
}
constexpr OpType C = OpType::compute, X = OpType::ccl;

// Two devices, a warm-up op before "start", two iterations each bounded by start/stop, and an
// op after the last "stop". Times in ns.
std::vector<OpRecord> two_devices(bool pair_per_iteration = true) {
  std::vector<OpRecord> r = {
      op(0, "matmul", C, 0, 100),  // warm-up: not measured, but the previous op of iteration 0
      sign(0, "start", 150),
      op(0, "matmul", C, 200, 1200),       // k 1000, lat 100
      op(0, "all_gather", X, 1300, 1800),  // k 500,  lat 100
      op(0, "add", C, 1850, 1950),         // k 100,  lat 50
      sign(0, "stop", 2000),
      sign(0, "start", 2100),
      op(0, "matmul", C, 2200, 3400),      // k 1200, lat 250
      op(0, "all_gather", X, 3500, 4300),  // k 800,  lat 100
      op(0, "add", C, 4400, 4460),         // k 60,   lat 100
      sign(0, "stop", 4500),
      op(0, "matmul", C, 5000, 6000),  // after the region
      op(1, "matmul", C, 0, 120),
      sign(1, "start", 150),
      op(1, "matmul", C, 300, 1100),       // k 800,  lat 180
      op(1, "all_gather", X, 1250, 1950),  // k 700,  lat 150
      op(1, "add", C, 2000, 2200),         // k 200,  lat 50
      sign(1, "stop", 2250),
      sign(1, "start", 2260),
      op(1, "matmul", C, 2300, 3800),      // k 1500, lat 100
      op(1, "all_gather", X, 3900, 4300),  // k 400,  lat 100
      op(1, "add", C, 4350, 4390),         // k 40,   lat 50
      sign(1, "stop", 4500),
  };
  if (!pair_per_iteration) {
    std::erase_if(r, [](const OpRecord& x) {
      return x.op_type == OpType::signpost && ((x.attributes == "stop" && x.start_ns < 4000) ||
                                               (x.attributes == "start" && x.start_ns > 2000));
    });
  }
  return r;
}

// Worked by hand from the comments above:
//  iteration 0: matmul  -> slowest device 0: k 1000, lat 100 (its own row, not dev 1's 180)
//               all_gather -> mean: k (500+700)/2 = 600, lat (100+150)/2 = 125
//               add     -> slowest device 1: k 200, lat 50
//  iteration 1: matmul  -> slowest device 1: k 1500, lat 100
//               all_gather -> mean: k (800+400)/2 = 600, lat (100+100)/2 = 100
//               add     -> slowest device 0: k 60, lat 100
//  averages: matmul k 1250, lat 100; all_gather k 600, lat 112.5; add k 130, lat 75 (ns)
//  totals: kernel 1980 ns = 1.98 us; op-to-op 287.5 ns = 0.2875 us
void expect_hand_worked(const Aggregate& a) {
  EXPECT_EQ(a.devices, 2);
  EXPECT_EQ(a.iterations, 2);
  ASSERT_EQ(a.ops.size(), 3u);
  EXPECT_EQ(a.ops[0].op_code, "matmul");
  EXPECT_EQ(a.ops[1].op_code, "all_gather");
  EXPECT_EQ(a.ops[1].op_type, OpType::ccl);
  EXPECT_EQ(a.ops[1].attributes, "axis=1;dim=0");
  EXPECT_EQ(a.ops[2].op_code, "add");
  EXPECT_DOUBLE_EQ(a.ops[0].kernel_duration_us, 1.25);
  EXPECT_DOUBLE_EQ(a.ops[0].op_to_op_latency_us, 0.1);
  EXPECT_DOUBLE_EQ(a.ops[1].kernel_duration_us, 0.6);
  EXPECT_DOUBLE_EQ(a.ops[1].op_to_op_latency_us, 0.1125);
  EXPECT_DOUBLE_EQ(a.ops[2].kernel_duration_us, 0.13);
  EXPECT_DOUBLE_EQ(a.ops[2].op_to_op_latency_us, 0.075);
  EXPECT_DOUBLE_EQ(a.total_kernel_duration_us, 1.98);
  EXPECT_DOUBLE_EQ(a.total_op_to_op_latency_us, 0.2875);
}

TEST(PerfAggregate, MaxForComputeMeanForCclAveragedOverIterations) {
  expect_hand_worked(aggregate(two_devices()));
}

TEST(PerfAggregate, OnePairSplitIntoGivenIterations) {
  const auto r = two_devices(false);
  expect_hand_worked(aggregate(r, {.iterations = 2}));
  // Without the count, the single pair is one iteration of six ops.
  EXPECT_EQ(aggregate(r).ops.size(), 6u);
}

TEST(PerfAggregate, DeviceOrderInTheInputDoesNotMatter) {
  auto r = two_devices();
  std::stable_partition(r.begin(), r.end(), [](const OpRecord& x) { return x.device_id == 1; });
  expect_hand_worked(aggregate(r));
}

TEST(PerfAggregate, OpTimingsSkipSignposts) {
  const auto r = two_devices();
  const auto t = op_timings(r);
  EXPECT_EQ(t[0].op_to_op_ns, 0);  // a device's first op
  EXPECT_EQ(t[0].kernel_ns, 100);
  EXPECT_EQ(t[1].kernel_ns, 0);      // signpost
  EXPECT_EQ(t[2].op_to_op_ns, 100);  // 200 - 100: the signpost at 150 is not an op
  EXPECT_EQ(t[7].op_to_op_ns, 250);
  EXPECT_EQ(t[19].op_to_op_ns, 100);
}

TEST(PerfAggregate, SingleDeviceIsItsOwnMaxAndMean) {
  std::vector<OpRecord> r = {sign(0, "start", 0), op(0, "rms_norm", C, 10, 40),
                             op(0, "all_reduce", X, 45, 145), sign(0, "stop", 150)};
  const Aggregate a = aggregate(r, {.devices = 1});
  EXPECT_DOUBLE_EQ(a.total_kernel_duration_us, 0.13);    // 30 + 100 ns
  EXPECT_DOUBLE_EQ(a.total_op_to_op_latency_us, 0.005);  // 0 (first op) + 5 ns
}

TEST(PerfAggregate, BadInputs) {
  expect_error([] { aggregate({}); }, {"no op records"});
  auto r = two_devices();
  std::erase_if(r, [](const OpRecord& x) { return x.device_id == 1 && x.attributes == "start"; });
  expect_error([&] { aggregate(r); }, {"device 1", "no \"start\" signpost"});
  r = two_devices();
  std::erase_if(r, [](const OpRecord& x) { return x.attributes == "stop"; });
  expect_error([&] { aggregate(r); }, {"device 0", "no \"stop\" signpost"});
  r = two_devices();
  r.erase(r.begin() + 19);  // device 1, iteration 1 loses its matmul
  expect_error([&] { aggregate(r); }, {"device 1 runs 2 ops in iteration 1", "device 0 runs 3"});
  r = two_devices();
  r[16].op_code = "mul";  // device 1, iteration 0, position 2
  expect_error([&] { aggregate(r); }, {"op 2 of iteration 0 on device 1 is 'mul'", "'add'"});
  r = two_devices();
  r[8].op_type = OpType::compute;  // all_gather recorded as compute on device 0, iteration 1
  expect_error([&] { aggregate(r); }, {"mismatched op sequences"});
  expect_error([] { aggregate(two_devices(false), {.iterations = 4}); },
               {"6 ops", "do not split into 4"});
  expect_error([] { aggregate(two_devices(), {.iterations = 3}); },
               {"3 iterations were given", "2 start/stop signpost pairs"});
  expect_error([] { aggregate(two_devices(), {.devices = 4}); },
               {"records of 2 devices, expected 4"});
  std::vector<OpRecord> empty_iteration = {sign(0, "start", 0), sign(0, "stop", 1)};
  expect_error([&] { aggregate(empty_iteration); }, {"has no ops"});
  std::vector<OpRecord> nested = {sign(0, "start", 0), op(0, "a", C, 1, 2), sign(0, "start", 3),
                                  op(0, "a", C, 4, 5), sign(0, "stop", 6)};
  expect_error([&] { aggregate(nested); }, {"inside an iteration"});
  std::vector<OpRecord> double_stop = {sign(0, "start", 0), op(0, "a", C, 1, 2), sign(0, "stop", 3),
                                       sign(0, "stop", 4)};
  expect_error([&] { aggregate(double_stop); }, {"\"stop\" signpost", "without a \"start\""});
}

}  // namespace test_perf_aggregate
}  // namespace meshtest::perf
