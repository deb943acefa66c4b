// The verdict rule and the "[rank r/N] file:line" report format.
#include "dist/testing/verdict.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace meshtest::dist::testing::detail {

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
          v.parts.push_back(p);
        }
      }
    }
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
  std::string text = fmt::format("[rank {}/{}] {}: {}\n{}", p.rank, size, where,
                                 p.skip ? "Skipped" : "Failure", p.message);
  if (text.back() != '\n') {
    text += '\n';
  }
  return text;
}

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

}  // namespace meshtest::dist::testing::detail
