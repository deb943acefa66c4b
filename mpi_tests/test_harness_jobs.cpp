// The MPI test harness's failure paths, each run as a child job (mpirun -np K harness_case on
// rank 0 only) whose exit status, duration and output are checked.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dist/testing/harness/harness.hpp"
#include "mpi_tests/harness_cases/spawn.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest::dist::testing {
namespace {

namespace fs = std::filesystem;

/// The failure-path program: env MESHTEST_HARNESS_CASE, else the path CMake gave, else
/// harness_cases/harness_case next to this binary.
std::string case_binary() {
#ifdef MESHTEST_HARNESS_CASE
  const char* built = MESHTEST_HARNESS_CASE;
#else
  const char* built = nullptr;
#endif
  return harness_cases::case_program("MESHTEST_HARNESS_CASE", built, "harness_case");
}

using harness_cases::mpiexec;

/// "harness_case.cpp:<line>" of the line holding "MARK:<tag>" in harness_case.cpp.
std::string mark(const std::string& tag) {
  std::ifstream in(std::string(MESHTEST_SOURCE_DIR) + "/mpi_tests/harness_cases/harness_case.cpp");
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find("// MARK:" + tag) != std::string::npos) {
      return "harness_case.cpp:" + std::to_string(n);
    }
  }
  ADD_FAILURE() << "no MARK:" << tag << " in harness_case.cpp";
  return "?";
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// A child job and the reports directory it wrote to.
struct Job {
  harness_cases::ChildResult r;
  fs::path dir;
  const std::string& out() const { return r.output; }
};

/// Runs `mpirun -np np --oversubscribe harness_case --gtest_filter=filter ...` (then
/// `args` after them, e.g. an MPMD ": -np 1 ...") with a hard timeout.
Job run_case(int np, const std::string& filter, const std::vector<std::string>& env = {},
             const std::vector<std::string>& args = {},
             std::chrono::seconds timeout = std::chrono::seconds(90)) {
  Job job;
  std::string tmpl = (test_support::run_temp_dir() / "harness-XXXXXX").string();
  job.dir = ::mkdtemp(tmpl.data()) != nullptr ? fs::path(tmpl) : test_support::run_temp_dir();
  std::vector<std::string> argv = {mpiexec(),         "-np",         std::to_string(np),
                                   "--oversubscribe", case_binary(), "--gtest_filter=" + filter,
                                   "--gtest_color=no"};  // mpirun gives ranks a pty
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> extra = {"MESHTEST_REPORTS_DIR=" + (job.dir / "reports").string(),
                                    "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"};
  extra.insert(extra.end(), env.begin(), env.end());
  job.r = harness_cases::run_child(argv, harness_cases::child_environment(extra), timeout,
                                   (job.dir / "output.txt").string());
  return job;
}

/// Launching tests run on rank 0 only; the other ranks return at once and wait for the verdict.
class ChildJob : public ::testing::Test {
 protected:
  void SetUp() override {
    MESHTEST_TIMEOUT(240);
    launcher_ = world_rank() == 0;
    if (launcher_) {
      ASSERT_TRUE(fs::exists(case_binary())) << case_binary() << " is not built";
    }
  }
  void TearDown() override {
    if (launcher_ && !HasFailure() && !job_.dir.empty()) {
      fs::remove_all(job_.dir);
    }
  }
  /// Runs the job and checks how it ended: `ok` = exit 0; else a non-zero exit of mpirun.
  const Job& run(bool ok, int np, const std::string& filter,
                 const std::vector<std::string>& env = {},
                 const std::vector<std::string>& args = {}) {
    job_ = run_case(np, filter, env, args);
    EXPECT_FALSE(job_.r.timed_out) << "the child job hung:\n" << job_.out();
    if (ok) {
      EXPECT_EQ(job_.r.exit_code, 0) << job_.out();
    } else {
      EXPECT_NE(job_.r.exit_code, 0) << job_.out();
    }
    return job_;
  }
  /// One abort report that names the test.
  void expect_one_report(const std::string& test) const {
    EXPECT_EQ(count(job_.out(), "[meshtest] ==== ending the job"), 1) << job_.out();
    EXPECT_NE(job_.out().find("in test " + test + " with"), std::string::npos) << job_.out();
  }
  bool launcher_ = false;
  Job job_;
};

#define HAS(text, needle) EXPECT_NE((text).find(needle), std::string::npos) << (text)
#define LAUNCHER_ONLY() \
  if (!launcher_) return

TEST_F(ChildJob, PassingRunPrintsOnlyRank0OutputAndWritesRankLogs) {
  LAUNCHER_ONLY();
  // Shuffled and repeated: ranks that ordered tests differently would end the job.
  const Job& j = run(true, 4, "MeshTest.Pass*:Pass.*", {}, {"--gtest_shuffle", "--gtest_repeat=3"});
  EXPECT_LT(j.r.seconds, 20) << j.out();
  EXPECT_EQ(count(j.out(), "[==========] Running 3 tests"), 3) << j.out();
  EXPECT_EQ(count(j.out(), "[  PASSED  ] 3 tests."), 3) << j.out();
  EXPECT_EQ(count(j.out(), "ending the job"), 0) << j.out();
  HAS(j.out(), "stdout hello from rank 0");
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(count(j.out(), "hello from rank " + std::to_string(r)), 0) << j.out();
    const std::string log = read_file(j.dir / "reports" / "logs" / fmt::format("rank{}.log", r));
    HAS(log, fmt::format("stdout hello from rank {}", r));
    HAS(log, fmt::format("stderr hello from rank {}", r));
    HAS(log, fmt::format("[meshtest] rank {} exits with code 0", r));
  }
  EXPECT_FALSE(fs::exists(j.dir / "reports" / "logs" / "rank0.log"));
}

TEST_F(ChildJob, ExpectFailureOnRank2IsReportedOnceAndTheRunGoesOn) {
  LAUNCHER_ONLY();
  const std::string xml = (test_support::run_temp_dir() / "expect.xml").string();
  const Job& j = run(false, 4, "MeshTest.FailExpectOnRank2:MeshTest.PassTwice", {},
                     {"--gtest_output=xml:" + xml});
  EXPECT_LT(j.r.seconds, 20) << j.out();
  EXPECT_EQ(count(j.out(), "[rank 2/4] "), 1) << j.out();
  HAS(j.out(), mark("expect_rank2") + ": Failure");
  EXPECT_EQ(count(j.out(), "expect failed on rank 2"), 1) << j.out();
  HAS(j.out(), "[  FAILED  ] MeshTest.FailExpectOnRank2");
  HAS(j.out(), "[       OK ] MeshTest.PassTwice");
  EXPECT_EQ(count(j.out(), "ending the job"), 0) << j.out();
  for (int r = 1; r < 4; ++r) {
    HAS(read_file(j.dir / "reports" / "logs" / fmt::format("rank{}.log", r)),
        fmt::format("[meshtest] rank {} exits with code 1", r));
  }
  const std::string report = read_file(xml);
  HAS(report, "failures=\"1\"");
  HAS(report, "[rank 2/4] Expected equality");
  HAS(report, "expect failed on rank 2");
  fs::remove(xml);
}

TEST_F(ChildJob, FailuresOnTwoRanksAreEachReportedOnce) {
  LAUNCHER_ONLY();
  const Job& j = run(false, 3, "MeshTest.FailOnRanks0And2");
  HAS(j.out(), "[rank 0/3] ");
  EXPECT_EQ(count(j.out(), mark("fail_rank0") + ": Failure\nFailed\nfirst failure on rank 0"), 1);
  EXPECT_EQ(count(j.out(), mark("fail_rank2") + ": Failure\nFailed\nsecond failure on rank 2"), 1);
  EXPECT_EQ(count(j.out(), "failure on rank"), 2) << j.out();
}

TEST_F(ChildJob, FailEarlyWhileOthersComputeDoesNotEndTheJob) {
  LAUNCHER_ONLY();
  const Job& j = run(false, 4, "Fail.EarlyWhileOthersCompute:Pass.NoCollective");
  EXPECT_LT(j.r.seconds, 20) << j.out();
  HAS(j.out(), "[rank 1/4] ");
  HAS(j.out(), mark("early_fail"));
  HAS(j.out(), "[  FAILED  ] Fail.EarlyWhileOthersCompute");
  HAS(j.out(), "[       OK ] Pass.NoCollective");
  EXPECT_EQ(count(j.out(), "ending the job"), 0) << j.out();
}

/// The report of a rank that left the test while `waiting` ranks sit inside all_reduce.
void expect_stuck_in_all_reduce(const std::string& out, const std::vector<int>& waiting) {
  for (int r : waiting) {
    HAS(out, fmt::format("[meshtest]   rank {}: in test", r));
  }
  EXPECT_GE(count(out, "; last collective: all_reduce #"), static_cast<int>(waiting.size()));
  EXPECT_GE(count(out, "(waiting inside)"), static_cast<int>(waiting.size())) << out;
}

TEST_F(ChildJob, ThrowOnRank1EndsTheJobWhileOthersWaitInAllReduce) {
  LAUNCHER_ONLY();
  const Job& j = run(false, 4, "MeshTest.ThrowOnRank1");
  EXPECT_LT(j.r.seconds, 20) << j.out();
  expect_one_report("MeshTest.ThrowOnRank1");
  HAS(j.out(),
      "[rank 1/4] unknown file: Failure\nC++ exception with description \"boom on rank 1\"");
  HAS(j.out(), "ranks that did not arrive at the end of the test: 0, 2, 3\n");
  expect_stuck_in_all_reduce(j.out(), {0, 2, 3});
}

TEST_F(ChildJob, FailedAssertOnRank1ThenAllReduceEndsTheJob) {
  LAUNCHER_ONLY();
  const Job& j = run(false, 4, "MeshTest.AssertOnRank1ThenAllReduce");
  EXPECT_LT(j.r.seconds, 20) << j.out();
  expect_one_report("MeshTest.AssertOnRank1ThenAllReduce");
  HAS(j.out(), "[rank 1/4] ");
  HAS(j.out(), mark("assert_rank1") + ": Failure");
  HAS(j.out(), "assert failed on rank 1");
  HAS(j.out(), "rank 1 failed test MeshTest.AssertOnRank1ThenAllReduce");
  HAS(j.out(), "ranks that did not arrive at the end of the test: 0, 2, 3\n");
  expect_stuck_in_all_reduce(j.out(), {0, 2, 3});
}

TEST_F(ChildJob, FailureWhileOthersWaitOutsideTheCclLogEndsTheJobAfterFiveGraces) {
  LAUNCHER_ONLY();
  const Job& j = run(false, 3, "Fail.AssertOnRank1ThenRawMpiBarrier", {"MESHTEST_FAILURE_GRACE=1"});
  EXPECT_GE(j.r.seconds, 5) << j.out();
  EXPECT_LT(j.r.seconds, 20) << j.out();
  expect_one_report("Fail.AssertOnRank1ThenRawMpiBarrier");
  HAS(j.out(),
      "rank 1 failed test Fail.AssertOnRank1ThenRawMpiBarrier and rank(s) 0, 2 did not "
      "arrive within 5 s");
  HAS(j.out(), "rank 1 fails before the barrier");
}

TEST_F(ChildJob, FailedAssertAtTwoRanks) {
  LAUNCHER_ONLY();
  const Job& j = run(false, 2, "MeshTest.AssertOnRank1ThenAllReduce");
  EXPECT_LT(j.r.seconds, 20) << j.out();
  expect_one_report("MeshTest.AssertOnRank1ThenAllReduce");
  HAS(j.out(), "[rank 1/2] ");
  HAS(j.out(), "ranks that did not arrive at the end of the test: 0\n");
  expect_stuck_in_all_reduce(j.out(), {0});
}

TEST_F(ChildJob, ExitOnRank1EndsTheJob) {
  LAUNCHER_ONLY();
  const Job& j = run(false, 4, "MeshTest.ExitOnRank1");
  EXPECT_LT(j.r.seconds, 20) << j.out();
  expect_one_report("MeshTest.ExitOnRank1");
  HAS(j.out(), "rank 1 exited with status 3 in test MeshTest.ExitOnRank1");
  HAS(j.out(), "ranks that did not arrive at the end of the test: 0, 1, 2, 3\n");
  expect_stuck_in_all_reduce(j.out(), {0, 2, 3});
}

TEST_F(ChildJob, ExitOnRank0EndsTheJob) {
  LAUNCHER_ONLY();
  const Job& j = run(false, 3, "MeshTest.ExitOnRank0");
  EXPECT_LT(j.r.seconds, 20) << j.out();
  expect_one_report("MeshTest.ExitOnRank0");
  HAS(j.out(), "rank 0 exited with status 4 in test MeshTest.ExitOnRank0");
  expect_stuck_in_all_reduce(j.out(), {1, 2});
}

TEST_F(ChildJob, SegvOnRank1IsNamedAndEndsTheJob) {
  LAUNCHER_ONLY();
  const Job& j = run(false, 4, "MeshTest.SegvOnRank1");
  EXPECT_LT(j.r.seconds, 20) << j.out();
  // The report names the faulting instruction's module and offset (addr2line's input).
  EXPECT_EQ(count(j.out(), "[rank 1/4] crashed with SIGSEGV in test MeshTest.SegvOnRank1, at "), 1)
      << j.out();
  HAS(j.out(), "harness_case +0x");
}

TEST_F(ChildJob, WildCallNamesItsCaller) {
  LAUNCHER_ONLY();
  const Job& j = run(false, 2, "MeshTest.WildCallOnRank1");
  EXPECT_LT(j.r.seconds, 20) << j.out();
  EXPECT_EQ(count(j.out(), "[rank 1/2] crashed with SIGSEGV in test MeshTest.WildCallOnRank1, at "),
            1)
      << j.out();
  // The caller is code of the test binary, named by module and offset.
  const std::size_t at = j.out().find("called from ");
  ASSERT_NE(at, std::string::npos) << j.out();
  HAS(j.out().substr(at), "harness_case +0x");
}

TEST_F(ChildJob, AbortOnRank1IsNamedAndEndsTheJob) {
  LAUNCHER_ONLY();
  const Job& j = run(false, 2, "MeshTest.AbortOnRank1");
  EXPECT_LT(j.r.seconds, 20) << j.out();
  EXPECT_EQ(count(j.out(), "[rank 1/2] crashed with SIGABRT in test MeshTest.AbortOnRank1\n"), 1)
      << j.out();
}

TEST_F(ChildJob, DeadlineFromEnvEndsASleepingRanksTest) {
  LAUNCHER_ONLY();
  const Job& j = run(false, 4, "MeshTest.SleepPastDeadline", {"MESHTEST_TEST_TIMEOUT=3"});
  EXPECT_GE(j.r.seconds, 3);
  EXPECT_LT(j.r.seconds, 25) << j.out();
  expect_one_report("MeshTest.SleepPastDeadline");
  HAS(j.out(), "test MeshTest.SleepPastDeadline exceeded its deadline of 3 s");
  HAS(j.out(), "ranks that did not arrive at the end of the test: 0, 1, 2, 3\n");
  HAS(j.out(), "rank 1: in test MeshTest.SleepPastDeadline; last collective: all_reduce #");
  expect_stuck_in_all_reduce(j.out(), {0, 2, 3});
  HAS(j.out(), "(completed)");  // rank 1's last all_reduce
}

TEST_F(ChildJob, ARankThatReturnsWhileOthersWaitForItIsADesyncAtOnce) {
  LAUNCHER_ONLY();
  const Job& j = run(false, 4, "MeshTest.OneRankReturnsOthersWait");
  // Found at once (1.7 s from mpirun to its exit on 2 idle cores), not at the test's 30 s
  // deadline; a third of it leaves room for a busy machine.
  EXPECT_LT(j.r.seconds, 10) << "found at once, not at the test's 30 s deadline\n" << j.out();
  expect_one_report("MeshTest.OneRankReturnsOthersWait");
  HAS(j.out(),
      "collective desync: rank 1 ended test MeshTest.OneRankReturnsOthersWait (passed) after 0 "
      "collective(s) on the group of ranks 0, 1, 2, 3, while rank(s) 0, 2, 3 wait in "
      "all_reduce #");
  HAS(j.out(), "(collective #1 of that group)");
  HAS(j.out(), "ranks that did not arrive at the end of the test: 0, 2, 3\n");
  HAS(j.out(), "ranks that arrived: 1 (passed)");
  expect_stuck_in_all_reduce(j.out(), {0, 2, 3});
}

TEST_F(ChildJob, ARankThatLeavesIsNoDesyncForCollectivesWithoutIt) {
  LAUNCHER_ONLY();
  const Job& j = run(true, 4, "Subgroup.OneRankLeavesTheOthersGoOnWithoutIt");
  HAS(j.out(), "[       OK ] Subgroup.OneRankLeavesTheOthersGoOnWithoutIt");
  EXPECT_EQ(j.out().find("desync"), std::string::npos) << j.out();
}

TEST_F(ChildJob, SkipOnAllRanksIsOneSkip) {
  LAUNCHER_ONLY();
  const Job& j = run(true, 4, "Skip.AllRanks");
  // Once in the test's report, once in the job's last line ("every test skipped: ...").
  EXPECT_EQ(count(j.out(), "nothing to do here"), 2) << j.out();
  HAS(j.out(), "[rank 0/4] ");
  HAS(j.out(), mark("skip_all") + ": Skipped");
  HAS(j.out(), "(skipped on ranks 0, 1, 2, 3)");
  HAS(j.out(), "[  SKIPPED ] Skip.AllRanks");
}

TEST_F(ChildJob, SkipOnOneRankSkipsTheTestEverywhere) {
  LAUNCHER_ONLY();
  const std::string xml = (test_support::run_temp_dir() / "skip.xml").string();
  const Job& j = run(true, 4, "Skip.OneRank", {}, {"--gtest_output=xml:" + xml});
  EXPECT_EQ(count(j.out(), "rank 2 lacks a feature"), 2) << j.out();  // the test, the job
  HAS(j.out(), "[rank 2/4] ");
  HAS(j.out(), mark("skip_rank2") + ": Skipped");
  HAS(j.out(), "[  SKIPPED ] Skip.OneRank");
  HAS(read_file(xml), "skipped=\"1\"");
  fs::remove(xml);
}

TEST_F(ChildJob, AJobWhoseTestsAllSkipSaysSoForCTest) {
  LAUNCHER_ONLY();
  // Named as meshtest_add_mpi_test names it, for CTest's SKIP_REGULAR_EXPRESSION.
  const Job& j = run(true, 3, "Skip.AllRanks:Skip.OneRank", {"MESHTEST_CTEST_NAME=case.np3"});
  EXPECT_EQ(count(j.out(), "[meshtest] every test of case.np3 skipped: "), 1) << j.out();
  HAS(j.out(), "skipped: nothing to do here");  // the first test's reason
  // One test that passes: no such line (CTest reports the job as passed).
  const Job& k = run(true, 3, "Skip.AllRanks:Pass.NoCollective");
  EXPECT_EQ(count(k.out(), "every test skipped"), 0) << k.out();
}

TEST_F(ChildJob, AnUnpreparedRankSkipsEveryTestOnEveryRankBeforeItRuns) {
  LAUNCHER_ONLY();
  // Rank 2 is not prepared (as a rank without a GPU under meshtest::gpu_gtest_main): no test
  // body runs anywhere (MeshTest.PassAllReduce's collective would need every rank), each test
  // is skipped with rank 2's reason, and the job says that every test skipped.
  const Job& j = run(true, 4, "MeshTest.Pass*:Pass.*:Fail.EarlyWhileOthersCompute",
                     {"MESHTEST_CASE_UNPREPARED_RANK=2", "MESHTEST_CASE_COUNT_PREPARED=1"});
  HAS(j.out(), "[  SKIPPED ] 4 tests");
  HAS(j.out(), "[meshtest] every test skipped: rank 2 is not prepared");
  EXPECT_EQ(count(j.out(), "rank 2 is not prepared"), 5) << j.out();  // 4 tests, 1 summary
  EXPECT_EQ(count(j.out(), "[  FAILED  ]"), 0) << j.out();
  EXPECT_EQ(count(j.out(), "[case] rank 0 prepares"), 1) << j.out();
  // Listing the tests prepares nothing.
  const Job& l = run(true, 2, "Pass.*", {"MESHTEST_CASE_COUNT_PREPARED=1"}, {"--gtest_list_tests"});
  EXPECT_EQ(count(l.out(), "prepares"), 0) << l.out();
}

TEST_F(ChildJob, FailureWinsOverSkip) {
  LAUNCHER_ONLY();
  const Job& j = run(false, 3, "Skip.OneRankSkipsAnotherFails");
  HAS(j.out(), "[rank 2/3] ");
  HAS(j.out(), mark("skip_and_fail"));
  HAS(j.out(), "[  FAILED  ] Skip.OneRankSkipsAnotherFails");
  EXPECT_EQ(count(j.out(), "rank 1 skips"), 0) << j.out();
}

TEST_F(ChildJob, RanksRunningDifferentTestsEndTheJob) {
  LAUNCHER_ONLY();
  // MPMD: rank 0 runs two tests, rank 1 only the first.
  const Job& j = run(false, 1, "Pass.NoCollective:Skip.AllRanks", {},
                     {":", "-np", "1", case_binary(), "--gtest_filter=Pass.NoCollective"});
  EXPECT_LT(j.r.seconds, 20) << j.out();
  EXPECT_EQ(count(j.out(), "[meshtest] ==== ending the job: ranks ran different tests"), 1)
      << j.out();
  HAS(j.out(), "finished all its tests");
}

/// Processes whose environment holds `entry` ("NAME=value").
std::vector<pid_t> processes_with_env(const std::string& entry) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    const std::string env = read_file(e.path() / "environ");
    if (env.find(entry + '\0') != std::string::npos) {
      out.push_back(std::stoi(name));
    }
  }
  return out;
}

TEST_F(ChildJob, HungChildJobIsKilledAtItsTimeoutWithAllItsRanks) {
  LAUNCHER_ONLY();
  // The job would hang for 60 s (its own deadline); run_child's 3 s timeout must end it.
  job_ = run_case(3, "MeshTest.SleepPastDeadline", {"MESHTEST_TEST_TIMEOUT=60"}, {},
                  std::chrono::seconds(3));
  EXPECT_TRUE(job_.r.timed_out);
  EXPECT_LT(job_.r.seconds, 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_TRUE(processes_with_env("MESHTEST_REPORTS_DIR=" + (job_.dir / "reports").string()).empty())
      << "ranks of the killed job survive";
  fs::remove_all(job_.dir);
  job_.dir.clear();
}

}  // namespace
}  // namespace meshtest::dist::testing
