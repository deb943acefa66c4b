// Flight recorder files: JSON writer and validating reader, and the cross-rank summary.
#include "src/perf/flight.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <tuple>

#include "src/core/error.hpp"

namespace meshtest::perf {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::array<FlightState, 4> kStates = {FlightState::queued, FlightState::waiting,
                                                FlightState::done, FlightState::failed};

/// j[key] as T, or an Error naming the source, the key and what was expected.
template <class T>
T field(const json& j, const char* key, std::string_view where) {
  const auto it = j.find(key);
  bool ok = it != j.end();
  if constexpr (std::is_same_v<T, std::string>) {
    ok = ok && it->is_string();
  } else if constexpr (std::is_unsigned_v<T>) {
    ok = ok && it->is_number_unsigned();
  } else {
    ok = ok && it->is_number_integer();
  }
  MESHTEST_CHECK(ok, "{}: field '{}' missing or not {}", where, key,
                 std::is_same_v<T, std::string> ? "a string"
                 : std::is_unsigned_v<T>        ? "a non-negative integer"
                                                : "an integer");
  return it->get<T>();
}

FlightState state_of(const std::string& name, std::string_view where) {
  for (FlightState s : kStates) {
    if (flight_state_name(s) == name) return s;
  }
  fail("{}: state '{}' is not one of queued, waiting, done, failed", where, name);
}

/// What a rank did at one seq, as the summary groups ranks: op, axis, signature, the count on
/// its group and state.
using Did = std::tuple<std::string, std::string, std::uint64_t, std::uint64_t, FlightState>;

/// "rank 2", "ranks 0, 1, 3", "ranks 0-5, 7": sorted ranks, a run of three or more consecutive
/// ones as a range, so that a summary stays one screen at any job size.
std::string ranks_text(std::vector<int> ranks) {
  std::ranges::sort(ranks);
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] <= ranks[j] + 1) ++j;
    if (j >= i + 2) {
      parts.push_back(fmt::format("{}-{}", ranks[i], ranks[j]));
    } else {
      for (std::size_t k = i; k <= j; ++k) parts.push_back(fmt::format("{}", ranks[k]));
    }
    i = j + 1;
  }
  return fmt::format("rank{} {}", ranks.size() > 1 ? "s" : "", fmt::join(parts, ", "));
}

std::string entry_text(const FlightEntry& e, std::int64_t now_us) {
  const std::int64_t end = e.end_us >= 0 ? e.end_us : now_us;
  return fmt::format("{} #{} {} ({}, {:.3f} s{})", e.op, e.seq, e.detail,
                     flight_state_name(e.state), static_cast<double>(end - e.start_us) / 1e6,
                     e.group_seq > 0 ? fmt::format(", #{} of its group", e.group_seq) : "");
}

}  // namespace

std::string_view flight_state_name(FlightState s) {
  switch (s) {
    case FlightState::queued:
      return "queued";
    case FlightState::waiting:
      return "waiting";
    case FlightState::done:
      return "done";
    case FlightState::failed:
      return "failed";
  }
  return "?";
}

std::string flight_json(const FlightDump& d) {
  json entries = json::array();
  for (const FlightEntry& e : d.entries) {
    entries.push_back({{"seq", e.seq},
                       {"op", e.op},
                       {"axis", e.axis},
                       {"group_seq", e.group_seq},
                       {"signature", fmt::format("{:016x}", e.signature)},
                       {"detail", e.detail},
                       {"bytes", e.bytes},
                       {"start_us", e.start_us},
                       {"end_us", e.end_us},
                       {"state", flight_state_name(e.state)}});
  }
  const json j = {{"rank", d.rank},       {"size", d.size},     {"host", d.host},
                  {"pid", d.pid},         {"reason", d.reason}, {"activity", d.activity},
                  {"time_us", d.time_us}, {"entries", entries}};
  return j.dump(1) + "\n";
}

FlightDump parse_flight_json(std::string_view text, std::string_view source) {
  const std::string where(source);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not JSON: {}", where, e.what());
  }
  MESHTEST_CHECK(j.is_object(), "{}: a flight dump is a JSON object", where);
  FlightDump d;
  d.rank = field<int>(j, "rank", where);
  d.size = field<int>(j, "size", where);
  MESHTEST_CHECK(d.size >= 1 && d.size <= kMaxFlightRanks, "{}: size {} is not 1 .. {}", where,
                 d.size, kMaxFlightRanks);
  MESHTEST_CHECK(d.rank >= 0 && d.rank < d.size, "{}: rank {} out of range for size {}", where,
                 d.rank, d.size);
  d.host = field<std::string>(j, "host", where);
  d.pid = field<std::int64_t>(j, "pid", where);
  d.reason = field<std::string>(j, "reason", where);
  d.activity = field<std::string>(j, "activity", where);
  d.time_us = field<std::int64_t>(j, "time_us", where);
  const auto it = j.find("entries");
  MESHTEST_CHECK(it != j.end() && it->is_array(), "{}: field 'entries' missing or not an array",
                 where);
  for (const json& x : *it) {
    const std::string at = fmt::format("{} entry {}", where, d.entries.size());
    MESHTEST_CHECK(x.is_object(), "{}: not an object", at);
    FlightEntry e;
    e.seq = field<std::uint64_t>(x, "seq", at);
    e.op = field<std::string>(x, "op", at);
    e.axis = field<std::string>(x, "axis", at);
    e.group_seq = field<std::uint64_t>(x, "group_seq", at);
    const std::string sig = field<std::string>(x, "signature", at);
    MESHTEST_CHECK(std::regex_match(sig, std::regex("[0-9a-f]{16}")),
                   "{}: signature '{}' is not 16 hex digits", at, sig);
    e.signature = std::stoull(sig, nullptr, 16);
    e.detail = field<std::string>(x, "detail", at);
    e.bytes = field<std::int64_t>(x, "bytes", at);
    e.start_us = field<std::int64_t>(x, "start_us", at);
    e.end_us = field<std::int64_t>(x, "end_us", at);
    e.state = state_of(field<std::string>(x, "state", at), at);
    MESHTEST_CHECK(e.seq >= 1 && e.seq < kMaxFlightSeq, "{}: seq {} is not 1 .. 2^62", at, e.seq);
    MESHTEST_CHECK(d.entries.empty() || e.seq == d.entries.back().seq + 1,
                   "{}: seq {} does not follow {}", at, e.seq, d.entries.back().seq);
    d.entries.push_back(std::move(e));
  }
  return d;
}

std::vector<FlightDump> read_flight_dir(const fs::path& dir) {
  MESHTEST_CHECK(fs::is_directory(dir), "flight: '{}' is not a directory", dir.string());
  std::vector<FlightDump> out;
  const std::regex name("rank([0-9]+)\\.json");
  for (const auto& f : fs::directory_iterator(dir)) {
    if (!std::regex_match(f.path().filename().string(), name)) continue;
    std::ifstream in(f.path(), std::ios::binary);
    MESHTEST_CHECK(in.good(), "flight: cannot read '{}'", f.path().string());
    std::ostringstream text;
    text << in.rdbuf();
    out.push_back(parse_flight_json(text.str(), f.path().string()));
    MESHTEST_CHECK(f.path().filename().string() == fmt::format("rank{}.json", out.back().rank),
                   "flight: '{}' holds the dump of rank {}", f.path().string(), out.back().rank);
  }
  MESHTEST_CHECK(!out.empty(), "flight: no rank<r>.json in '{}'", dir.string());
  std::ranges::sort(out, {}, &FlightDump::rank);
  return out;
}

namespace {
/// Up to this many dumps, the summary ends with a line per rank; beyond, a line per group.
constexpr std::size_t kFlightRankLines = 16;
}  // namespace

std::string flight_summary(std::span<const FlightDump> dumps, int size) {
  MESHTEST_CHECK(!dumps.empty(), "flight summary: no dumps");
  if (size <= 0) size = dumps.front().size;
  MESHTEST_CHECK(size <= kMaxFlightRanks, "flight summary: {} ranks is more than {}", size,
                 kMaxFlightRanks);
  std::int64_t now = 0;
  std::vector<int> have;
  std::map<std::string, std::vector<int>> reasons;
  for (const FlightDump& d : dumps) {
    now = std::max(now, d.time_us);
    have.push_back(d.rank);
    reasons[d.reason].push_back(d.rank);
  }
  std::ranges::sort(have);
  const auto twice = std::ranges::adjacent_find(have);
  MESHTEST_CHECK(twice == have.end(), "flight summary: two dumps of rank {}", *twice);
  std::vector<int> absent;
  for (int r = 0; r < size; ++r) {
    if (!std::ranges::binary_search(have, r)) absent.push_back(r);
  }
  std::string out =
      fmt::format("[meshtest] flight recorder: {} of {} ranks dumped", dumps.size(), size);
  for (const auto& [reason, ranks] : reasons) {
    out += fmt::format("; {} ({})", reason, ranks_text(ranks));
  }
  out += absent.empty() ? "\n" : fmt::format("; no dump from {}\n", ranks_text(absent));

  // The history every dump still holds: from the latest first seq on.
  std::uint64_t from = 1, to = 0;
  for (const FlightDump& d : dumps) {
    if (d.entries.empty()) continue;
    from = std::max(from, d.entries.front().seq);
    to = std::max(to, d.entries.back().seq);
  }
  const auto at = [](const FlightDump& d, std::uint64_t seq) -> const FlightEntry* {
    if (d.entries.empty() || seq < d.entries.front().seq || seq > d.entries.back().seq) {
      return nullptr;
    }
    return &d.entries[seq - d.entries.front().seq];
  };
  std::uint64_t first = 0;
  for (std::uint64_t s = from; s <= to && first == 0; ++s) {
    std::vector<Did> seen;
    for (const FlightDump& d : dumps) {
      const FlightEntry* e = at(d, s);
      if (e == nullptr || e->state != FlightState::done) {
        first = s;
        break;
      }
      seen.emplace_back(e->op, e->axis, e->signature, e->group_seq, e->state);
    }
    if (first == 0 && std::ranges::adjacent_find(seen, std::not_equal_to{}) != seen.end()) {
      first = s;
    }
  }
  if (first == 0) {
    out += to == 0 ? "[meshtest]   no collective recorded on any rank\n"
                   : fmt::format(
                         "[meshtest]   every rank did the same collectives #{}..#{}, "
                         "all done\n",
                         from, to);
  } else {
    out += fmt::format("[meshtest]   the ranks first differ at collective #{}:\n", first);
    std::map<Did, std::vector<int>> groups;
    std::map<std::uint64_t, std::vector<int>> stopped;  // last seq -> ranks without #first
    for (const FlightDump& d : dumps) {
      if (const FlightEntry* e = at(d, first)) {
        groups[{e->op, e->axis, e->signature, e->group_seq, e->state}].push_back(d.rank);
      } else {
        stopped[d.entries.empty() ? 0 : d.entries.back().seq].push_back(d.rank);
      }
    }
    for (const auto& [did, ranks] : groups) {
      const FlightDump& d = *std::ranges::find(dumps, ranks.front(), &FlightDump::rank);
      out +=
          fmt::format("[meshtest]     {}: {}\n", ranks_text(ranks), entry_text(*at(d, first), now));
    }
    for (const auto& [last, ranks] : stopped) {
      out += fmt::format("[meshtest]     {}: {}\n", ranks_text(ranks),
                         last == 0 ? std::string("no collective recorded")
                                   : fmt::format("never entered it (last: #{})", last));
    }
  }
  const auto last_text = [now](const FlightDump& d) {
    return d.entries.empty() ? std::string("none") : entry_text(d.entries.back(), now);
  };
  if (dumps.size() <= kFlightRankLines) {
    for (const FlightDump& d : dumps) {
      out += fmt::format("[meshtest]   rank {}: {}; last: {}\n", d.rank, d.activity, last_text(d));
    }
    return out;
  }
  // Many ranks: one line per (activity, last collective), timed as its lowest rank saw it.
  using Last = std::tuple<std::string, std::uint64_t, std::string, std::string, FlightState>;
  std::map<Last, std::vector<int>> lasts;
  for (const FlightDump& d : dumps) {
    const FlightEntry none;
    const FlightEntry& e = d.entries.empty() ? none : d.entries.back();
    lasts[{d.activity, e.seq, e.op, e.detail, e.state}].push_back(d.rank);
  }
  for (const auto& [key, ranks] : lasts) {
    const FlightDump& d =
        *std::ranges::find(dumps, *std::ranges::min_element(ranks), &FlightDump::rank);
    out += fmt::format("[meshtest]   {}: {}; last: {}{}\n", ranks_text(ranks), d.activity,
                       last_text(d), ranks.size() > 1 ? fmt::format(" on rank {}", d.rank) : "");
  }
  return out;
}

}  // namespace meshtest::perf
