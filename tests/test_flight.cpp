// The flight recorder's files and summary, on crafted dumps.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "src/perf/flight.hpp"
#include "tests/support/expect_error.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest::perf {
namespace test_flight {

FlightEntry entry(std::uint64_t seq, std::string op, FlightState s = FlightState::done,
                  std::uint64_t sig = 7) {
  return {.seq = seq,
          .op = std::move(op),
          .axis = "all",
          .group_seq = seq,
          .signature = sig,
          .detail = "f32[4] op sum axis all",
          .bytes = 16,
          .start_us = 1'000'000 * static_cast<std::int64_t>(seq),
          .end_us = s == FlightState::done ? 1'000'000 * static_cast<std::int64_t>(seq) + 5 : -1,
          .state = s};
}

FlightDump dump(int rank, std::vector<FlightEntry> entries) {
  return {.rank = rank,
          .size = 4,
          .host = "h",
          .pid = 100 + rank,
          .reason = "deadline",
          .activity = "test T.X",
          .time_us = 10'000'000,
          .entries = std::move(entries)};
}

TEST(Flight, JsonRoundTrip) {
  const FlightDump d = dump(2, {entry(5, "all_reduce"), entry(6, "all_gather", FlightState::waiting,
                                                              0xfedcba9876543210ULL)});
  const FlightDump back = parse_flight_json(flight_json(d), "x");
  EXPECT_EQ(back.rank, 2);
  EXPECT_EQ(back.pid, 102);
  ASSERT_EQ(back.entries.size(), 2U);
  EXPECT_EQ(back.entries[1].signature, 0xfedcba9876543210ULL);
  EXPECT_EQ(back.entries[1].state, FlightState::waiting);
  EXPECT_EQ(back.entries[1].end_us, -1);
  EXPECT_EQ(back.entries[0].detail, "f32[4] op sum axis all");
}

TEST(Flight, BadDumpsAreErrorsNamingTheField) {
  const std::string good = flight_json(dump(0, {entry(1, "all_reduce"), entry(2, "all_reduce")}));
  test_support::expect_error([] { parse_flight_json("{", "f.json"); }, {"f.json", "not JSON"});
  test_support::expect_error([] { parse_flight_json("[]", "f.json"); }, {"JSON object"});
  std::string s = good;
  s.replace(s.find("\"rank\": 0"), 9, "\"rank\": 9");
  test_support::expect_error([&] { parse_flight_json(s, "f.json"); }, {"rank 9 out of range"});
  s = good;
  s.replace(s.find("\"done\""), 6, "\"gone\"");
  test_support::expect_error([&] { parse_flight_json(s, "f.json"); }, {"entry 0", "state 'gone'"});
  s = good;
  s.replace(s.find("\"seq\": 2"), 8, "\"seq\": 4");
  test_support::expect_error([&] { parse_flight_json(s, "f.json"); }, {"seq 4 does not follow 1"});
  s = good;
  s.replace(s.find("\"signature\": \""), 14, "\"signature\": \"zz");
  test_support::expect_error([&] { parse_flight_json(s, "f.json"); }, {"not 16 hex digits"});
}

TEST(Flight, SummaryNamesTheFirstCollectiveWhereTheRanksDiffer) {
  // Ranks 0, 1, 3 wait in all_reduce #3; rank 2 called all_gather there.
  std::vector<FlightDump> d;
  for (int r : {0, 1, 3}) {
    d.push_back(dump(r, {entry(1, "all_reduce"), entry(2, "all_reduce"),
                         entry(3, "all_reduce", FlightState::waiting)}));
  }
  d.insert(d.begin() + 2, dump(2, {entry(1, "all_reduce"), entry(2, "all_reduce"),
                                   entry(3, "all_gather", FlightState::waiting, 8)}));
  const std::string s = flight_summary(d);
  EXPECT_NE(s.find("4 of 4 ranks dumped"), std::string::npos) << s;
  EXPECT_NE(s.find("first differ at collective #3"), std::string::npos) << s;
  EXPECT_NE(s.find("ranks 0, 1, 3: all_reduce #3"), std::string::npos) << s;
  EXPECT_NE(s.find("rank 2: all_gather #3"), std::string::npos) << s;
}

TEST(Flight, SummaryNamesRanksThatStoppedOrDidNotDump) {
  // Rank 1 never entered #3 (it stopped after #2); rank 3 did not dump (it died).
  std::vector<FlightDump> d = {
      dump(0, {entry(2, "all_reduce"), entry(3, "all_reduce", FlightState::waiting)}),
      dump(1, {entry(1, "all_reduce"), entry(2, "all_reduce")}),
      dump(2, {entry(3, "all_reduce", FlightState::waiting)})};
  const std::string s = flight_summary(d, 4);
  EXPECT_NE(s.find("3 of 4 ranks dumped"), std::string::npos) << s;
  EXPECT_NE(s.find("no dump from rank 3"), std::string::npos) << s;
  EXPECT_NE(s.find("first differ at collective #3"), std::string::npos) << s;
  EXPECT_NE(s.find("rank 1: never entered it (last: #2)"), std::string::npos) << s;
}

TEST(Flight, LimitsRefuseAHostileDump) {
  // A dump claiming 2^31 - 1 ranks made the summary walk every one of them (found by fuzzing);
  // a seq of 2^64 - 1 followed by 0 "followed" it by wrapping.
  FlightDump big = dump(0, {entry(1, "all_reduce")});
  big.size = 2147483647;
  test_support::expect_error([&] { parse_flight_json(flight_json(big), "f.json"); },
                             {"f.json", "size 2147483647 is not 1 .. 1048576"});
  test_support::expect_error([&] { flight_summary(std::vector{big}); }, {"more than 1048576"});
  // Two dumps claiming one rank: the summary looked the rank up and found the other dump, one
  // without the collective it was printing (found by fuzzing).
  test_support::expect_error(
      [&] {
        flight_summary(std::vector{dump(0, {entry(1, "all_reduce")}),
                                   dump(1, {entry(1, "all_gather")}), dump(0, {})});
      },
      {"two dumps of rank 0"});
  const FlightDump wraps = dump(0, {entry(18446744073709551615ULL, "all_reduce")});
  test_support::expect_error([&] { parse_flight_json(flight_json(wraps), "f.json"); },
                             {"entry 0", "seq 18446744073709551615 is not 1 .. 2^62"});
}

TEST(Flight, SummaryNamesManyRanksAsRanges) {
  // 1000 ranks of which 990 wait in #2 and ten never entered it: one line each, not 1000 numbers.
  std::vector<FlightDump> d;
  for (int r = 0; r < 1000; ++r) {
    if (r >= 500 && r < 510) {
      d.push_back(dump(r, {entry(1, "all_reduce")}));
    } else {
      d.push_back(dump(r, {entry(1, "all_reduce"), entry(2, "all_reduce", FlightState::waiting)}));
    }
    d.back().size = 1002;
  }
  const std::string s = flight_summary(d);
  EXPECT_NE(s.find("no dump from ranks 1000, 1001"), std::string::npos) << s;
  EXPECT_NE(s.find("ranks 0-499, 510-999: all_reduce #2"), std::string::npos) << s;
  EXPECT_NE(s.find("ranks 500-509: never entered it"), std::string::npos) << s;
  EXPECT_LT(std::ranges::count(s, '\n'), 40) << s;
}

TEST(Flight, SummaryOfRanksThatAgree) {
  std::vector<FlightDump> d;
  for (int r = 0; r < 4; ++r)
    d.push_back(dump(r, {entry(8, "all_reduce"), entry(9, "all_gather")}));
  const std::string s = flight_summary(d);
  EXPECT_NE(s.find("every rank did the same collectives #8..#9, all done"), std::string::npos) << s;
}

TEST(Flight, ReadsADirectoryOfDumps) {
  const test_support::TempDir dir("flight");
  for (int r : {1, 0}) {
    std::ofstream(dir.path() / fmt::format("rank{}.json", r)) << flight_json(dump(r, {}));
  }
  std::ofstream(dir.path() / "notes.txt") << "ignored";
  const std::vector<FlightDump> d = read_flight_dir(dir.path());
  ASSERT_EQ(d.size(), 2U);
  EXPECT_EQ(d[0].rank, 0);
  EXPECT_NE(flight_summary(d).find("no collective recorded on any rank"), std::string::npos);
  test_support::expect_error([&] { read_flight_dir(dir.path() / "none"); }, {"not a directory"});
  std::ofstream(dir.path() / "rank1.json") << flight_json(dump(0, {}));
  test_support::expect_error([&] { read_flight_dir(dir.path()); },
                             {"rank1.json' holds the dump of rank 0"});
  std::filesystem::remove(dir.path() / "rank0.json");
  std::filesystem::remove(dir.path() / "rank1.json");
  test_support::expect_error([&] { read_flight_dir(dir.path()); }, {"no rank<r>.json"});
}

}  // namespace test_flight
}  // namespace meshtest::perf
