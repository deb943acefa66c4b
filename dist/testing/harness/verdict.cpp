// The verdict rule and the "[rank r/N] file:line" report format.
#include "dist/testing/harness/verdict.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <regex>

#include "src/perf/flight.hpp"

namespace meshtest::dist::testing::detail {

namespace {

/// A failure's message with the "[rank r] " that dist errors start with made rank-free: the
/// same error thrown on every device of a group (a CCL's agreed error) is reported once.
std::string rank_free(const std::string& message) {
  static const std::regex rank(R"(\[rank [0-9]+\] )");
  return std::regex_replace(message, rank, "[rank *] ");
}

/// Appends p to parts, or names its rank in `also` of an earlier part with the same place and
/// rank-free message.
void add_part(std::vector<TestPart>& parts, const TestPart& p) {
  for (TestPart& q : parts) {
    if (q.file == p.file && q.line == p.line && rank_free(q.message) == rank_free(p.message)) {
      q.also += fmt::format("{}{}", q.also.empty() ? "" : ", ", p.rank);
      return;
    }
  }
  parts.push_back(p);
}

/// The flight recorder's summary over the dumps the ranks sent (a rank sends one when a
/// collective failed in the test); empty when none did.
std::string flight_of(const std::vector<Arrival>& arrivals) {
  std::vector<perf::FlightDump> dumps;
  try {
    for (const Arrival& a : arrivals) {
      if (!a.flight.empty()) dumps.push_back(perf::parse_flight_json(a.flight, "flight dump"));
    }
    return dumps.empty() ? std::string()
                         : perf::flight_summary(dumps, static_cast<int>(arrivals.size()));
  } catch (const std::exception& e) {
    return fmt::format("[meshtest] flight recorder: {}\n", e.what());
  }
}

}  // namespace

Verdict agree(const std::vector<Arrival>& arrivals) {
  Verdict v;
  std::vector<int> failed;
  for (std::size_t r = 0; r < arrivals.size(); ++r) {
    const Arrival& a = arrivals[r];
    if (a.status == Status::failed) {
      failed.push_back(static_cast<int>(r));
    }
    if (a.status == Status::skipped) {
      v.skipped.push_back(static_cast<int>(r));
    }
  }
  if (!failed.empty()) {
    v.status = Status::failed;
    v.summary = fmt::format("failed on rank{} {} of {} (reported by rank 0)",
                            failed.size() > 1 ? "s" : "", rank_list(failed), arrivals.size());
    for (int r : failed) {
      for (const TestPart& p : arrivals[static_cast<std::size_t>(r)].parts) {
        if (!p.skip) {
          add_part(v.parts, p);
        }
      }
    }
    v.flight = flight_of(arrivals);
  } else if (!v.skipped.empty()) {
    v.status = Status::skipped;
    const int first = v.skipped.front();
    for (const TestPart& p : arrivals[static_cast<std::size_t>(first)].parts) {
      if (p.skip) {
        v.parts.push_back(p);
        break;
      }
    }
    const std::string message = v.parts.empty() ? std::string() : v.parts.front().message;
    v.summary =
        fmt::format("skipped on rank{} {} of {}{}{}", v.skipped.size() > 1 ? "s" : "",
                    rank_list(v.skipped), arrivals.size(), message.empty() ? "" : ": ", message);
  }
  if (v.status == Status::passed) {
    v.summary = fmt::format("passed on all {} ranks", arrivals.size());
  }
  return v;
}

Verdict agree_finish(const std::vector<Arrival>& arrivals) {
  Verdict v;
  std::vector<int> bad;
  for (std::size_t r = 0; r < arrivals.size(); ++r) {
    if (arrivals[r].exit_code != 0) {
      bad.push_back(static_cast<int>(r));
    }
  }
  if (!bad.empty()) {
    v.status = Status::failed;
    v.exit_code = 1;
    v.summary = fmt::format("RUN_ALL_TESTS failed on rank{} {} of {}", bad.size() > 1 ? "s" : "",
                            rank_list(bad), arrivals.size());
  }
  return v;
}

std::string format_part(const TestPart& p, int size) {
  const std::string where = p.file.empty() ? std::string("unknown file")
                            : p.line >= 0  ? fmt::format("{}:{}", p.file, p.line)
                                           : p.file;
  std::string text =
      fmt::format("[rank {}/{}] {}: {}{}\n{}", p.rank, size, where, p.skip ? "Skipped" : "Failure",
                  p.also.empty() ? "" : fmt::format(" (the same on ranks {})", p.also), p.message);
  if (text.back() != '\n') {
    text += '\n';
  }
  return text;
}

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

}  // namespace meshtest::dist::testing::detail
