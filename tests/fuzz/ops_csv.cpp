// Fuzz target ops_csv: parse_ops_csv, then the aggregation meshtest-report runs on it and the
// writer's round trip (ops_csv of the records must parse back to the same records).
#include "src/perf/ops_csv.hpp"
#include "src/perf/aggregate.hpp"
#include "tests/fuzz/fuzz_target.hpp"

using namespace meshtest;

MESHTEST_FUZZ_TARGET(in) {
  const perf::OpsReport rep = perf::parse_ops_csv(in.text(), "fuzz.csv");
  fuzz::require(!rep.records.empty() && rep.lines.size() == rep.records.size(),
                "a parsed report has records, each with its line");
  const perf::Aggregate a = fuzz::must([&] { return perf::aggregate(rep.records); });
  fuzz::require(!a.ops.empty() && a.devices > 0, "a parsed report aggregates to some ops");
  const perf::OpsReport again =
      fuzz::must([&] { return perf::parse_ops_csv(perf::ops_csv(rep.records), "rewritten.csv"); });
  fuzz::require(again.records.size() == rep.records.size(), "the rewritten report keeps its rows");
}
