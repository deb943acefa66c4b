// Fuzz target flight: parse_flight_json (what meshtest-report flight reads from
// reports/flight/rank<r>.json), then flight_summary over the dumps. The input holds up to four
// dumps separated by NUL bytes, so the summary meets ranks that disagree.
#include <vector>

#include "src/perf/flight.hpp"
#include "tests/fuzz/fuzz_target.hpp"

using namespace meshtest;

MESHTEST_FUZZ_TARGET(in) {
  std::string_view rest = in.text();
  std::vector<perf::FlightDump> dumps;
  while (!rest.empty() && dumps.size() < 4) {
    const std::size_t end = rest.find('\0');
    dumps.push_back(perf::parse_flight_json(rest.substr(0, end), "fuzz/rank.json"));
    rest = end == std::string_view::npos ? std::string_view{} : rest.substr(end + 1);
  }
  if (dumps.empty()) return;
  for (const perf::FlightDump& d : dumps) {
    const perf::FlightDump again =
        fuzz::must([&] { return perf::parse_flight_json(perf::flight_json(d), "rewritten.json"); });
    fuzz::require(again.entries.size() == d.entries.size() && again.rank == d.rank,
                  "flight_json then parse_flight_json gives the dump back");
  }
  const std::string summary = perf::flight_summary(dumps);
  fuzz::require(summary.starts_with("[meshtest] flight recorder:"), "the summary's first line");
}
