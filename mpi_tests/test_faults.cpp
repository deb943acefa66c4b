// Every fault a user can meet ends the job promptly and names its cause. Each case of
// harness_cases/fault_case.cpp runs as a child job (mpirun -np 4, a 12 s deadline) in which
// rank 2 misbehaves; this test checks how the job ended: a non-zero exit within the deadline
// + 10 s (a desync, a skipped collective included, within 2 s of the last rank reaching the
// collective), one message that names rank 2, the test and, where one is involved, the
// collective with its sequence number and signature, every rank's job-end hooks run once where
// the harness ended the job, and no process of the job left behind.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "dist/testing/harness/harness.hpp"
#include "mpi_tests/harness_cases/fault_jobs.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest::dist::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int kRanks = 4;
constexpr int kDeadline = 12;  // seconds, MESHTEST_TEST_TIMEOUT of the child job

std::string fault_binary() {
#ifdef MESHTEST_FAULT_CASE
  const char* built = MESHTEST_FAULT_CASE;
#else
  const char* built = nullptr;
#endif
  return harness_cases::case_program("MESHTEST_FAULT_CASE", built, "fault_case");
}

enum class Kind {
  failure,   ///< rank 2 fails or exits: the job ends well within the deadline
  died,      ///< rank 2 dies by a signal: mpirun ends the job, well within the deadline
  deadline,  ///< rank 2 stalls: the deadline ends the job
  desync,    ///< the collective reports it at once, on every rank
  skipped,   ///< rank 2 left the test without a collective the others wait in: the
             ///< coordinator's pass watch ends the job at once
};

struct Case {
  const char* name;  ///< MeshTest.<name> in fault_case.cpp
  Kind kind;
  std::vector<const char*> says;  ///< what the job's output must hold, beyond rank and test
};

std::ostream& operator<<(std::ostream& o, const Case& c) { return o << c.name; }

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"Throw", Kind::failure, {"rank 2 throws", "all_reduce #3 f32[4]"}},
      {"Assert", Kind::failure, {"rank 2 fails an ASSERT", "all_reduce #3 f32[4]"}},
      {"Exit", Kind::failure, {"rank 2 exited with status 3"}},
      {"SigKill", Kind::died, {"rank 2", "signal 9"}},
      {"Segv", Kind::died, {"rank 2", "SIGSEGV"}},
      {"SleepPastDeadline", Kind::deadline, {"exceeded its deadline", "all_reduce #3 f32[4]"}},
      {"OtherCcl",
       Kind::desync,
       {"collective desync on axis all of mesh",
        "device 2 (axis index 2) called all_gather as collective #3",
        "devices 0, 1, 3 called all_reduce #3"}},
      {"OtherDtype", Kind::desync, {"mixed dtypes", "device 2 (axis index 2) passes f64"}},
      {"OtherShape", Kind::desync, {"shapes disagree", "device 2 (axis index 2) passes f32[5]"}},
      {"AllToAllVCounts", Kind::desync, {"all_to_all_v", "device 2"}},
      // A skipped collective that looks like the next one cannot be told from it at the
      // collective: the ranks pair rank 2's #3 with the others' #3 and so on, until the others
      // wait in #5, which rank 2 never enters: it ends the test with one collective fewer on
      // that group, which the coordinator sees from its arrival.
      {"SkipOne",
       Kind::skipped,
       {"collective desync: rank 2 ended test MeshTest.SkipOne (passed) after 4 collective(s) "
        "on the group of ranks 0, 1, 2, 3, while rank(s) 0, 1, 3 wait in all_reduce #5 f32[4]",
        "(collective #5 of that group)", "the ranks first differ at collective #5",
        "rank 2: never entered it (last: #4)"}},
      {"RawRecv", Kind::deadline, {"exceeded its deadline", "all_reduce #3 f32[4]"}},
      {"KilledFromOutside", Kind::died, {"rank 2", "signal 9"}},
  };
  return all;
}

class Faults : public ::testing::TestWithParam<Case> {};

TEST_P(Faults, EndPromptlyNamingTheCause) {
  MESHTEST_TIMEOUT(kDeadline + 90);
  if (world_rank() != 0) return;  // rank 0 launches; the others wait for the verdict
  const Case& c = GetParam();
  ASSERT_TRUE(fs::exists(fault_binary())) << fault_binary() << " is not built";
  const test_support::TempDir dir(std::string("fault_") + c.name);
  const std::string marker = fmt::format("MESHTEST_FAULT_JOB={}-{}", ::getpid(), c.name);
  const fs::path pid_file = dir.path() / "rank2.pid";

  // (l): kill -9 rank 2 from outside once it has written its pid.
  std::atomic<bool> done{false};
  std::thread killer([&] {
    if (std::string(c.name) != "KilledFromOutside") return;
    while (!done.load() && !fs::exists(pid_file)) std::this_thread::sleep_for(20ms);
    if (done.load()) return;
    ::kill(static_cast<pid_t>(std::stol(harness_cases::slurp(pid_file))), SIGKILL);
  });
  const harness_cases::FaultJob job = harness_cases::run_fault_job(
      fault_binary(), kRanks, std::string("MeshTest.") + c.name, dir.path(), kDeadline,
      {"MESHTEST_FAULT_PID_FILE=" + pid_file.string(), marker, "OMPI_ALLOW_RUN_AS_ROOT=1",
       "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"});
  done.store(true);
  killer.join();

  const harness_cases::ChildResult& r = job.result;
  const std::string& out = r.output;
  const std::string all = out + job.logs;  // the logs: the "[fault] ... reaches" lines
  SCOPED_TRACE("the job's output:\n" + out);

  EXPECT_FALSE(r.timed_out) << "the job hung";
  EXPECT_NE(r.exit_code, 0) << "the job exited 0";
  EXPECT_LE(r.seconds, kDeadline + 10) << "the job took " << r.seconds << " s";
  EXPECT_EQ(job.reached, kRanks) << "not every rank reached the faulty step:\n" << all;
  const double after = static_cast<double>(job.ended_ms - job.last_reach_ms) / 1000;
  RecordProperty("seconds", fmt::format("{:.1f}", r.seconds));
  RecordProperty("seconds_after_last_arrival", fmt::format("{:.1f}", after));
  std::printf("[fault] %s: exit %d after %.1f s (%.1f s after the last rank reached the step)\n",
              c.name, r.exit_code, r.seconds, after);
  if (c.kind == Kind::desync || c.kind == Kind::skipped) {
    // The target is 2 s (1.2 s measured on 2 idle cores, docs/reliability.md); the test only
    // asks for well before the deadline, so that a busy machine does not fail it.
    EXPECT_LT(after, kDeadline / 2.0) << "a desync must end the job at the collective, not at "
                                         "the deadline (target: within 2 s of the last arrival)";
  }

  // One message, naming rank 2 and the test.
  EXPECT_NE(out.find(std::string("MeshTest.") + c.name), std::string::npos);
  EXPECT_NE(out.find("rank 2"), std::string::npos);
  EXPECT_LE(harness_cases::count(out, "==== ending the job"), 1);
  for (const char* s : c.says) EXPECT_NE(all.find(s), std::string::npos) << "no '" << s << "'";
  if (c.kind == Kind::desync) {
    EXPECT_EQ(harness_cases::count(out, ": Failure"), 1)
        << "the same error on every device is reported once";
    EXPECT_NE(out.find("the same on ranks"), std::string::npos);
    EXPECT_NE(out.find("the ranks first differ at collective #3"), std::string::npos);
  }
  if (c.kind == Kind::desync || c.kind == Kind::skipped) {
    // Every device dumped its flight recorder, and rank 0 summarized them.
    for (int rank = 0; rank < kRanks; ++rank) {
      EXPECT_TRUE(fs::exists(dir.path() / "reports" / "flight" / fmt::format("rank{}.json", rank)))
          << "no flight dump of rank " << rank;
    }
  }
  if (c.kind == Kind::deadline) {
    EXPECT_NE(out.find("flight recorder"), std::string::npos);
  }
  // Where the harness ended the job, every rank ran its job-end hooks once; nowhere else.
  const bool harness_ended =
      c.kind == Kind::failure || c.kind == Kind::deadline || c.kind == Kind::skipped;
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(harness_cases::count(all, fmt::format("[fault] rank {} ran its job-end hooks", rank)),
              harness_ended ? 1 : 0)
        << "rank " << rank;
  }

  // Nothing of the job is left running.
  const std::vector<pid_t> left = harness_cases::kill_leftovers(marker);
  EXPECT_TRUE(left.empty()) << left.size() << " processes of the job are still running";
}

INSTANTIATE_TEST_SUITE_P(Rank2, Faults, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace meshtest::dist::testing
