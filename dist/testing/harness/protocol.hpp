// The control channel's messages (arrival, verdict, query, snapshot, exit) and how they travel.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dist/testing/harness/state.hpp"

namespace meshtest::dist::testing::detail {

/// Message tags. On Config::to_root: kArrive, kExited, kSnapshot (received by rank 0's
/// coordinator thread only). On Config::from_root: kVerdict (received by main threads) and
/// kQuery (received by the watchdog threads of ranks 1..N-1).
/// kFailed (to_root, the test's name): the first failure of a rank in a test, sent at once
/// (the rank may be slow to arrive: its fixture's teardown may wait, e.g. on its GPU).
enum Tag : int { kArrive = 1, kExited = 2, kSnapshot = 3, kQuery = 4, kVerdict = 5, kFailed = 6 };

/// A rank's main thread reached the end of a test (or of RUN_ALL_TESTS, `finish`).
struct Arrival {
  bool finish = false;     ///< RUN_ALL_TESTS returned `exit_code` on this rank
  std::int64_t index = 0;  ///< tests ended so far on this rank, this one included
  std::string name;        ///< full test name (Suite.Name)
  Status status = Status::passed;
  int exit_code = 0;
  std::vector<TestPart> parts;  ///< this rank's failures and skips in the test
  std::string flight;  ///< the flight recorder's dump (JSON) when a collective failed in the test
  std::vector<GroupCount> groups;  ///< ccl_group_counts() at the test's end: a rank that waits
                                   ///< in a collective its group's arrived ranks never called
                                   ///< is a desync (the coordinator's pass watch)
};

/// What every rank applies to its gtest result: the agreed status of the test.
struct Verdict {
  Status status = Status::passed;
  std::string summary;          ///< "failed on ranks 1, 3", "skipped on rank 2: <message>"
  std::vector<TestPart> parts;  ///< the parts rank 0 reports (failures, or the first skip)
  std::vector<int> skipped;     ///< ranks that skipped
  int exit_code = 0;            ///< for a finish: the job's exit code
  std::string flight;           ///< the flight recorder's summary, when a collective failed
};

/// A rank is exiting (exit(code) before the harness finished).
struct Exited {
  int code = 0;
  std::string activity;
};

std::string encode(const Arrival& a);
std::string encode(const Verdict& v);
std::string encode(const Snapshot& s);
std::string encode(const Exited& e);
/// Decoders throw meshtest::Error on a malformed message.
Arrival decode_arrival(std::string_view bytes);
Verdict decode_verdict(std::string_view bytes);
Snapshot decode_snapshot(std::string_view bytes);
Exited decode_exited(std::string_view bytes);

/// A snapshot query: its id, and the reason when the coordinator asks every rank to dump its
/// flight recorder (empty: a plain snapshot). The coordinator gives a reason only as it ends the
/// job: the watchdog answers, then runs the rank's job-end hooks (dist/mesh/job_end.hpp).
std::string encode_query(std::uint64_t id, std::string_view dump);
std::pair<std::uint64_t, std::string> decode_query(std::string_view bytes);

/// A received message.
struct Message {
  int source = 0;
  int tag = 0;
  std::string bytes;
};

/// Polling pause: a few yields, then sleeps growing from 0.1 ms to `max_ms` (low latency at the
/// end of a test, low CPU use when many ranks share few cores).
class Backoff {
 public:
  explicit Backoff(int max_ms = 2) : max_ms_(max_ms) {}
  void pause();
  void reset() { n_ = 0; }

 private:
  int max_ms_;
  int n_ = 0;
};

/// Receives a pending message matching (source, tag) if there is one.
std::optional<Message> try_receive(MPI_Comm comm, int source, int tag);
/// Waits (polling) for a message matching (source, tag).
Message receive(MPI_Comm comm, int source, int tag);
/// Sends `bytes`, polling until the send completes.
void send(MPI_Comm comm, int dest, int tag, const std::string& bytes);

}  // namespace meshtest::dist::testing::detail
