// meshtest::gtest_main: GoogleTest on every MPI rank with one verdict per test and no hangs.
//
// Every rank runs every test. At the end of each test, every rank sends its result to rank 0's
// coordinator thread (over a dup of MPI_COMM_WORLD) and waits for the verdict agreed by all:
//   - failed if any rank failed: rank 0 prints each failure once, in gtest's layout prefixed
//     with the rank, "[rank r/N] file:line: Failure\n<message>", and every rank records the test
//     as failed;
//   - else skipped if any rank skipped (GTEST_SKIP): rank 0 prints the lowest skipping rank's
//     message (and which ranks skipped), and the test counts as skipped on every rank. A rank
//     that skips leaves the test: skip before any collective, or on every rank;
//   - else passed.
// Only rank 0 prints; other ranks' stdout and stderr go to <reports>/logs/rank<r>.log, where
// <reports> is env MESHTEST_REPORTS_DIR or "reports" (relative to the working directory).
// Rank 0's gtest result (and so --gtest_output=xml, written by rank 0 only) is the job's
// verdict; the exit code is non-zero on every rank if any test failed anywhere. Every rank
// uses rank 0's --gtest_random_seed, so --gtest_shuffle orders tests alike.
//
// The job never hangs; it ends with one report on rank 0's stderr (why, the test, the failures
// known so far, the ranks that did not arrive at the end of the test and each one's activity
// and last collective from ccl_log_last()) and MPI_Abort when:
//   - a test runs past its deadline (default 60 s; env MESHTEST_TEST_TIMEOUT seconds; per test
//     set_test_timeout / MESHTEST_TIMEOUT);
//   - a rank failed (ASSERT, EXPECT, exception) and, after the failure grace (env
//     MESHTEST_FAILURE_GRACE seconds, default 2), ranks that have not arrived are seen stuck in
//     the same unfinished collective twice 0.5 s apart, or have still not arrived after 5
//     graces (they may wait in an MPI call that the collective log does not see). Ranks that
//     are merely slower (computing) and arrive within that time do not end the job;
//   - a rank calls exit() before the run ends (exit code = its status);
//   - ranks run different tests (different filters or test lists).
// A rank that crashes (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) prints
// "[rank r/N] crashed with SIGSEGV in test X" to its original stderr and mpirun ends the job.
// A job ended this way writes no gtest XML; its non-zero exit status is the verdict.
#pragma once

#include <chrono>
#include <cmath>
#include <functional>
#include <string>

namespace meshtest::dist::testing {

/// What a main prepares on every rank before the first test (collectively: every rank calls
/// it): "" to run the tests, or why none can run here. meshtest::gpu_gtest_main's binds each
/// rank to a GPU of its own, or answers "GPU ranks unavailable: <why>".
using PrepareRanks = std::function<std::string()>;

/// The harness's main: MPI_Init_thread (MPI_THREAD_MULTIPLE), GoogleTest, the
/// --meshtest_<name>=<value> flags (taken out of argv for harness_flag, flags.hpp; --help lists
/// them after GoogleTest's help), `prepare` (not for --help or --gtest_list_tests), every test
/// with agreed verdicts, MPI_Finalize. Returns the exit code (0 only if every test passed or
/// skipped on every rank). meshtest::gtest_main's main() is just this call.
///
/// Where `prepare` answers a reason on some rank, the lowest such rank's reason is agreed and
/// every test skips on every rank with it, before its fixture is set up. A run whose tests all
/// skipped (for that or their own reasons) ends with rank 0's line "[meshtest] every test of
/// <name> skipped: <first reason>", <name> from env MESHTEST_CTEST_NAME (which the harness
/// unsets, so that the jobs a test starts do not inherit it; without it: "every test
/// skipped: ..."); meshtest_add_mpi_test sets it and makes CTest report the line as Skipped.
///
/// Between a test's start and its verdict the harness keeps the communicators of the meshes
/// the test destroys (set_comm_keeper, dist/mesh/mesh_device.hpp) and frees them after the
/// verdict, when no rank is left inside the test: a rank whose fixture tears its mesh down
/// while others still wait in a collective it skipped never blocks in that teardown, and the
/// coordinator sees the desync at once (docs/reliability.md).
int run_all_tests(int& argc, char** argv, const PrepareRanks& prepare = {});

/// Sets the running test's deadline to `timeout` after its start (overriding the default of
/// 60 s or MESHTEST_TEST_TIMEOUT). Call it at the start of the test body on every rank; rank
/// 0's value is the one enforced.
void set_test_timeout(std::chrono::milliseconds timeout);

/// The deadline of a test that does not set its own: MESHTEST_TEST_TIMEOUT seconds, or 60 s.
std::chrono::milliseconds default_test_timeout();

/// This rank and the number of ranks in MPI_COMM_WORLD.
int world_rank();
int world_size();

}  // namespace meshtest::dist::testing

/// Sets the running test's deadline in seconds (may be fractional); see set_test_timeout.
#define MESHTEST_TIMEOUT(seconds)              \
  ::meshtest::dist::testing::set_test_timeout( \
      std::chrono::milliseconds(std::llround(static_cast<double>(seconds) * 1000.0)))
