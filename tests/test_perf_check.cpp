// Perf expectations (src/perf/perf_check.hpp): a measurements.json against an expected one,
// op by op and by totals, with a relative margin and an absolute floor; hand-made reports whose
// ratios are known, the margin's edges, the rows a report lacks, and bad input; expectations
// made from a measurement, and the machine they belong to (src/perf/machine.hpp).
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "src/perf/machine.hpp"
#include "src/perf/perf_check.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::perf {
namespace test_perf_check {

using test_support::expect_error;

/// A measurements.json of two ops (rms_norm `a` us, all_reduce `b` us) with their total and an
/// op-to-op total `l`; `extra` is spliced into the top-level object.
std::string report(double a, double b, double l = 10, const std::string& extra = "") {
  return fmt::format(
      R"({{"name": "x", "devices": 2, "iterations": 4, {}
          "ops": [{{"index": 0, "op_code": "rms_norm", "op_type": "compute", "attributes": "",
                    "devices": 2, "kernel_duration_us": {}, "op_to_op_latency_us": 1}},
                  {{"index": 1, "op_code": "all_reduce", "op_type": "ccl", "attributes": "",
                    "devices": 2, "kernel_duration_us": {}, "op_to_op_latency_us": 1}}],
          "total_kernel_duration_us": {}, "total_op_to_op_latency_us": {}}})",
      extra, a, b, a + b, l);
}

PerfCheck check(const std::string& expected, const std::string& measured,
                PerfCheckOptions opt = {}) {
  return check_perf(parse_perf_figures(expected, "expected.json"),
                    parse_perf_figures(measured, "measured.json"), opt);
}

TEST(PerfCheck, TheSameRunPasses) {
  const PerfCheck c = check(report(100, 50), report(100, 50));
  EXPECT_FALSE(c.regressed);
  ASSERT_EQ(c.rows.size(), 4u);  // two ops, total kernel, total op-to-op
  for (const PerfRow& r : c.rows) {
    EXPECT_EQ(r.ratio, 1.0) << r.what;
    EXPECT_EQ(r.verdict, PerfVerdict::ok) << r.what;
  }
  EXPECT_EQ(c.rows[0].what, "0 rms_norm");
  EXPECT_EQ(c.rows[2].what, "total kernel");
}

TEST(PerfCheck, TwentyPercentSlowerIsARegressionAtTenPercent) {
  const PerfCheck c = check(report(100, 50), report(120, 60));
  EXPECT_TRUE(c.regressed);
  EXPECT_DOUBLE_EQ(c.rows[0].ratio, 1.2);
  EXPECT_EQ(c.rows[0].verdict, PerfVerdict::regression);
  EXPECT_EQ(c.rows[2].verdict, PerfVerdict::regression);  // 180 against 150
  EXPECT_EQ(c.rows[3].verdict, PerfVerdict::ok);          // op-to-op unchanged
  const std::string t = c.table({});
  EXPECT_NE(t.find("REGRESSION"), std::string::npos) << t;
  EXPECT_NE(t.find("3 of 4 rows slower than expected by more than 10 %"), std::string::npos) << t;
  // The same run is within a margin of 25 %.
  EXPECT_FALSE(check(report(100, 50), report(120, 60), {.margin = 0.25}).regressed);
}

TEST(PerfCheck, TheMarginsEdgeAndTheAbsoluteFloor) {
  // Exactly 10 % slower is within the margin; a little more is not.
  EXPECT_FALSE(check(report(100, 50), report(110, 55)).regressed);
  EXPECT_TRUE(check(report(100, 50), report(110.5, 50)).regressed);
  // A tiny op 50 % slower: a regression without a floor, noise under --min-us 1.
  EXPECT_TRUE(check(report(100, 1), report(100, 1.5)).regressed);
  EXPECT_FALSE(check(report(100, 1), report(100, 1.5), {.margin = 0.1, .min_us = 1}).regressed);
}

TEST(PerfCheck, FasterIsSaidButNeverFails) {
  const PerfCheck c = check(report(100, 50), report(50, 50));
  EXPECT_FALSE(c.regressed);
  EXPECT_EQ(c.rows[0].verdict, PerfVerdict::faster);
  EXPECT_NE(c.table({}).find("--update"), std::string::npos);
}

TEST(PerfCheck, TheExpectationsMarginAndTheE2eRow) {
  const std::string e2e = R"("e2e": {"warmup": 1, "iterations": 4, "mean_us": 200},)";
  const PerfFigures f = parse_perf_figures(report(100, 50, 10, e2e + R"("margin": 0.3,)"), "e");
  EXPECT_EQ(f.margin, 0.3);
  EXPECT_EQ(f.e2e_mean_us, 200);
  const PerfFigures m = parse_perf_figures(
      report(100, 50, 10, R"("e2e": {"warmup": 1, "iterations": 4, "mean_us": 300},)"), "m");
  const PerfCheck c = check_perf(f, m, {});
  ASSERT_EQ(c.rows.size(), 5u);
  EXPECT_EQ(c.rows[4].what, "e2e mean");
  EXPECT_EQ(c.rows[4].verdict, PerfVerdict::regression);
  // A report without e2e (or op-to-op) leaves that row out.
  EXPECT_EQ(check_perf(f, parse_perf_figures(report(100, 50), "m"), {}).rows.size(), 4u);
}

TEST(PerfCheck, BadInputIsAnErrorNamingIt) {
  expect_error([] { parse_perf_figures("{", "a.json"); }, {"a.json: not JSON"});
  expect_error([] { parse_perf_figures("[]", "a.json"); }, {"a.json", "measurements.json object"});
  expect_error([] { parse_perf_figures(R"({"total_kernel_duration_us": 1})", "a.json"); },
               {"a.json", "no \"ops\" array"});
  std::string negative = report(100, 50);
  negative.replace(negative.find("\"kernel_duration_us\": 100"), 25, "\"kernel_duration_us\": -1");
  expect_error([&] { parse_perf_figures(negative, "a.json"); },
               {"a.json: op 0's \"kernel_duration_us\" is -1", "finite and >= 0"});
  expect_error([] { parse_perf_figures(report(1, 1, 1, R"("margin": -2,)"), "a.json"); },
               {"\"margin\" is -2"});
  // Another op sequence cannot be compared.
  std::string other = report(100, 50);
  other.replace(other.find("all_reduce"), 10, "all_gather");
  expect_error([&] { check(report(100, 50), other); },
               {"op 1 is all_reduce in the expectation but all_gather in the measurement"});
  expect_error([] { check(report(1, 1), report(1, 1), {.margin = -1}); }, {"margin"});
}

TEST(PerfCheck, TheOpToOpTotalCanBeLeftOut) {
  // Op-to-op five times the expectation: a regression while held, no row when left out.
  EXPECT_TRUE(check(report(100, 50, 10), report(100, 50, 50)).regressed);
  const PerfCheck c = check(report(100, 50, 10), report(100, 50, 50), {.op_to_op = false});
  EXPECT_FALSE(c.regressed);
  ASSERT_EQ(c.rows.size(), 3U);  // the two ops and the total kernel time
  EXPECT_EQ(c.rows[2].what, "total kernel");
}

TEST(PerfCheck, AnExpectationIsTheMeasurementWithItsMargin) {
  const PerfFigures e = parse_perf_figures(expectation_json(report(100, 50), 0.5, "m.json"), "e");
  EXPECT_EQ(e.margin, 0.5);
  ASSERT_EQ(e.ops.size(), 2U);
  EXPECT_EQ(e.ops[1].op_code, "all_reduce");
  EXPECT_EQ(e.ops[1].kernel_duration_us, 50);
  EXPECT_EQ(e.total_kernel_duration_us, 150);
  // Without a margin the measurement's own is kept (here: none).
  EXPECT_FALSE(parse_perf_figures(expectation_json(report(1, 2), std::nullopt, "m"), "e").margin);
  expect_error([] { expectation_json("{", std::nullopt, "m.json"); }, {"m.json: not JSON"});
  expect_error([] { expectation_json(report(1, 2), 11, "m.json"); },
               {"m.json", "the margin 11", "[0, 10]"});
}

TEST(PerfMachine, ThisMachineRoundTripsAndBadFilesAreNamed) {
  const Machine here = this_machine();
  EXPECT_FALSE(here.host.empty());
  EXPECT_FALSE(here.cpu.empty());
  EXPECT_GT(here.threads, 0);
  EXPECT_EQ(parse_machine(machine_json(here), "machine.json"), here);
  Machine other = here;
  other.threads += 1;
  EXPECT_NE(parse_machine(machine_json(other), "machine.json"), here);
  EXPECT_NE(describe(here).find(here.cpu), std::string::npos);
  expect_error([] { parse_machine("[", "m.json"); }, {"m.json: not JSON"});
  expect_error([] { parse_machine(R"({"host": "a", "cpu": "b"})", "m.json"); },
               {"m.json", "no \"threads\" integer"});
  expect_error([] { parse_machine(R"({"host": 1, "cpu": "b", "threads": 2})", "m.json"); },
               {"m.json", "no \"host\" string"});
  expect_error([] { read_machine("/nonexistent/machine.json"); },
               {"cannot read '/nonexistent/machine.json'"});
}

}  // namespace test_perf_check
}  // namespace meshtest::perf
