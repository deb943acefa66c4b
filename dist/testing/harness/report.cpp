// Formatting of the abort report printed by rank 0's coordinator.
#include "dist/testing/harness/report.hpp"

#include <fmt/format.h>

#include "dist/testing/harness/output.hpp"
#include "dist/testing/harness/verdict.hpp"
#include "src/perf/flight.hpp"

namespace meshtest::dist::testing::detail {

std::string format_report(const AbortReport& report) {
  const int n = report.size;
  std::string out = fmt::format("[meshtest] ==== ending the job: {} ====\n", report.reason);
  // Failures first: of the ranks that arrived, then those recorded so far on the others.
  std::vector<int> missing, arrived;
  for (int r = 0; r < n; ++r) {
    const auto& a = report.arrivals[static_cast<std::size_t>(r)];
    (a ? arrived : missing).push_back(r);
    const std::vector<TestPart>* parts = nullptr;
    if (a) {
      parts = &a->parts;
    } else if (const auto& s = report.snapshots[static_cast<std::size_t>(r)]) {
      parts = &s->parts;
    }
    if (parts == nullptr) {
      continue;
    }
    for (const TestPart& p : *parts) {
      if (!p.skip) {
        out += format_part(p, n);
      }
    }
  }
  out += fmt::format("[meshtest] in {} with {} rank{}\n", report.activity, n, n > 1 ? "s" : "");
  out += fmt::format("[meshtest] ranks that did not arrive at the end of the test: {}\n",
                     missing.empty() ? std::string("none") : rank_list(missing));
  for (int r : missing) {
    const auto& s = report.snapshots[static_cast<std::size_t>(r)];
    if (!s) {
      out += fmt::format("[meshtest]   rank {}: no answer from its watchdog\n", r);
      continue;
    }
    out += fmt::format("[meshtest]   rank {}: in {}; last collective: {}\n", r, s->activity,
                       describe(s->last));
  }
  if (!arrived.empty()) {
    std::string list;
    for (int r : arrived) {
      const Arrival& a = *report.arrivals[static_cast<std::size_t>(r)];
      const char* status = a.status == Status::failed    ? "failed"
                           : a.status == Status::skipped ? "skipped"
                                                         : "passed";
      list += fmt::format("{}{} ({})", list.empty() ? "" : ", ", r, a.finish ? "finished" : status);
    }
    out += fmt::format("[meshtest] ranks that arrived: {}\n", list);
  }
  out += "[meshtest] ==== calling MPI_Abort ====\n";
  return out;
}

std::string flight_summary_of(const std::vector<std::optional<Snapshot>>& snapshots, int size) {
  std::vector<perf::FlightDump> dumps;
  try {
    for (const auto& s : snapshots) {
      if (s && !s->flight.empty()) dumps.push_back(perf::parse_flight_json(s->flight, "flight"));
    }
    if (dumps.empty()) return {};
    return perf::flight_summary(dumps, size) +
           fmt::format(
               "[meshtest]   (dumps: {}/flight/rank<r>.json on each rank's host; "
               "meshtest-report flight DIR prints this summary again)\n",
               reports_dir());
  } catch (const std::exception& e) {
    return fmt::format("[meshtest] flight recorder: {}\n", e.what());
  }
}

}  // namespace meshtest::dist::testing::detail
