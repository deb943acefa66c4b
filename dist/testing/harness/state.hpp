// Process-wide state of the MPI test harness, shared by the main thread, the control thread and
// the exit hook (internal to dist/testing).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "dist/ccl/ccl_log.hpp"

namespace meshtest::dist::testing::detail {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

/// A test's result on one rank, or the verdict agreed by all ranks.
enum class Status : int { passed = 0, skipped = 1, failed = 2 };

/// One gtest failure or skip recorded on one rank.
struct TestPart {
  int rank = 0;
  bool skip = false;  ///< a GTEST_SKIP (else a failure)
  std::string file;   ///< "" when gtest does not know it (e.g. an exception)
  int line = -1;
  std::string message;
  std::string also;  ///< other ranks that failed with the same message: "1, 2, 3" (verdicts only)
};

/// What a rank is doing, as its control thread reports it to rank 0's coordinator.
struct Snapshot {
  int rank = 0;
  std::uint64_t query = 0;      ///< id of the query answered
  std::string activity;         ///< "test Suite.Name", "between tests (after Suite.Name)", ...
  CollectiveEntry last;         ///< ccl_log_last() of the rank
  std::vector<TestPart> parts;  ///< failures recorded so far in the running test
  std::string flight;           ///< the flight recorder's dump (JSON) when the query asked for it
};

/// Set once by run_all_tests before the control thread starts; read-only afterwards.
struct Config {
  int rank = 0;
  int size = 1;
  MPI_Comm to_root = MPI_COMM_NULL;    ///< dup of MPI_COMM_WORLD: every rank -> coordinator
  MPI_Comm from_root = MPI_COMM_NULL;  ///< dup of MPI_COMM_WORLD: coordinator -> every rank
  Millis default_timeout{60'000};      ///< per-test deadline unless a test sets its own
  Millis failure_grace{2'000};         ///< how long ranks may lag behind a failed rank
  std::string skip_every_test;         ///< agreed by every rank: why every test skips ("" runs)
};

/// The process's harness configuration.
Config& config();

/// The main thread entered test `name` (OnTestStart): the deadline clock restarts.
void begin_test(const std::string& name);
/// The main thread left test `name` (after its verdict).
void end_test(const std::string& name);
/// The running test's deadline is `timeout` from its start.
void set_timeout(Millis timeout);
/// Restarts the deadline clock with the default timeout (the coordinator, before a verdict).
void restart_clock();
/// Records a failure of the running test for snapshots; capped per test.
void record_part(TestPart part);
/// When the current activity's deadline expires, and its timeout.
Clock::time_point deadline();
Millis current_timeout();
/// "test Suite.Name", "between tests (after Suite.Name)", "before the first test", ...
std::string activity();
/// activity() as a plain NUL-terminated buffer (at most 511 bytes), for the crash handler:
/// async-signal-safe, never half-written (the writer fills the other of two buffers, then
/// switches).
const char* activity_for_signal();
/// snapshot(query) with this rank's flight recorder dumped to reports/flight/rank<r>.json
/// and kept in Snapshot::flight, for `reason`.
Snapshot snapshot_with_flight(std::uint64_t query, const std::string& reason);
/// This rank's activity, last collective and failures so far.
Snapshot snapshot(std::uint64_t query);

/// Seconds from env var `name` (unset or empty: `fallback`); throws meshtest::Error unless it is
/// a positive finite number.
Millis env_seconds(const char* name, Millis fallback);

}  // namespace meshtest::dist::testing::detail
