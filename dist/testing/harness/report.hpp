// The one message that ends a job: why, the test, failures, and what every missing rank does.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dist/testing/harness/protocol.hpp"

namespace meshtest::dist::testing::detail {

/// Everything rank 0's coordinator knows when it ends the job.
struct AbortReport {
  std::string reason;    ///< one sentence: "test X exceeded its deadline of 3 s", ...
  std::string activity;  ///< "test Suite.Name", "between tests (after ...)", ...
  int size = 1;
  std::vector<std::optional<Arrival>> arrivals;    ///< per rank: its arrival, if it arrived
  std::vector<std::optional<Snapshot>> snapshots;  ///< per rank: its answer to the last query
};

/// The report: failures of every rank ("[rank r/N] file:line: ..."), the ranks that did not
/// arrive at the end of the test and, for each, its activity and last collective.
std::string format_report(const AbortReport& report);

/// The flight recorder's summary (perf::flight_summary) over the dumps in `snapshots`; empty
/// when none holds one.
std::string flight_summary_of(const std::vector<std::optional<Snapshot>>& snapshots, int size);

}  // namespace meshtest::dist::testing::detail
