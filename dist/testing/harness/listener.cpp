// The verdict listener and rank 0's printer filter.
#include "dist/testing/harness/listener.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "dist/ccl/ccl_log.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "dist/testing/harness/control.hpp"
#include "dist/testing/harness/verdict.hpp"

namespace meshtest::dist::testing::detail {

namespace {

using ::testing::TestEventListener;
using ::testing::TestInfo;
using ::testing::TestPartResult;
using ::testing::UnitTest;

/// Forwards every event to gtest's printer except failures inside a test (rank 0 prints those
/// itself, for every rank, at the end of the test).
class PrinterFilter : public TestEventListener {
 public:
  explicit PrinterFilter(TestEventListener* printer) : p_(printer) {}
  void OnTestProgramStart(const UnitTest& u) override { p_->OnTestProgramStart(u); }
  void OnTestIterationStart(const UnitTest& u, int i) override { p_->OnTestIterationStart(u, i); }
  void OnEnvironmentsSetUpStart(const UnitTest& u) override { p_->OnEnvironmentsSetUpStart(u); }
  void OnEnvironmentsSetUpEnd(const UnitTest& u) override { p_->OnEnvironmentsSetUpEnd(u); }
  void OnTestSuiteStart(const ::testing::TestSuite& s) override { p_->OnTestSuiteStart(s); }
#ifndef GTEST_REMOVE_LEGACY_TEST_CASEAPI_
  void OnTestCaseStart(const ::testing::TestCase& s) override { p_->OnTestCaseStart(s); }
  void OnTestCaseEnd(const ::testing::TestCase& s) override { p_->OnTestCaseEnd(s); }
#endif
  void OnTestStart(const TestInfo& t) override {
    in_test_ = true;
    p_->OnTestStart(t);
  }
  void OnTestDisabled(const TestInfo& t) override { p_->OnTestDisabled(t); }
  void OnTestPartResult(const TestPartResult& r) override {
    // (UnitTest::current_test_info() would deadlock here: gtest holds its mutex.)
    if (!in_test_) {
      p_->OnTestPartResult(r);
    }
  }
  void OnTestEnd(const TestInfo& t) override {
    p_->OnTestEnd(t);
    in_test_ = false;
  }
  void OnTestSuiteEnd(const ::testing::TestSuite& s) override { p_->OnTestSuiteEnd(s); }
  void OnEnvironmentsTearDownStart(const UnitTest& u) override {
    p_->OnEnvironmentsTearDownStart(u);
  }
  void OnEnvironmentsTearDownEnd(const UnitTest& u) override { p_->OnEnvironmentsTearDownEnd(u); }
  void OnTestIterationEnd(const UnitTest& u, int i) override { p_->OnTestIterationEnd(u, i); }
  void OnTestProgramEnd(const UnitTest& u) override { p_->OnTestProgramEnd(u); }

 private:
  std::unique_ptr<TestEventListener> p_;
  bool in_test_ = false;
};

std::string full_name(const TestInfo& t) {
  return std::string(t.test_suite_name()) + "." + t.name();
}

/// Adds a part to the running test's result without tripping --gtest_throw_on_failure.
void inject(TestPartResult::Type type, const char* file, int line, const std::string& message) {
  const bool throw_on_failure = GTEST_FLAG_GET(throw_on_failure);
  const bool break_on_failure = GTEST_FLAG_GET(break_on_failure);
  GTEST_FLAG_SET(throw_on_failure, false);
  GTEST_FLAG_SET(break_on_failure, false);
  ::testing::internal::AssertHelper(type, file, line, message.c_str()) = ::testing::Message();
  GTEST_FLAG_SET(throw_on_failure, throw_on_failure);
  GTEST_FLAG_SET(break_on_failure, break_on_failure);
}

/// The communicators of the meshes destroyed during the running test, in the order their
/// meshes handed them over (the same on every rank that ran the same test code).
std::vector<MPI_Comm>& kept_comms() {
  static std::vector<MPI_Comm> kept;
  return kept;
}

void keep_comm(MPI_Comm comm) { kept_comms().push_back(comm); }

/// Frees the running test's kept communicators, in order (every rank has left the test body).
void free_kept_comms() {
  set_comm_keeper(nullptr);
  for (MPI_Comm& comm : kept_comms()) MPI_Comm_free(&comm);
  kept_comms().clear();
}

class VerdictListener : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const TestInfo& t) override {
    begin_test(full_name(t));
    ccl_forget_freed_groups();
    first_seq_ = ccl_log_last().seq + 1;
    told_ = false;
    name_ = full_name(t);
    if (c_.rank != 0) {
      std::printf("[meshtest] RUN %s\n", full_name(t).c_str());
    }
    set_comm_keeper(keep_comm);
    if (!c_.skip_every_test.empty()) {  // gtest runs no part of a test skipped here
      injecting_ = true;
      inject(TestPartResult::kSkip, t.file(), t.line(), c_.skip_every_test);
      injecting_ = false;
    }
  }

  void OnTestPartResult(const TestPartResult& r) override {
    if (injecting_ || r.type() == TestPartResult::kSuccess) {
      return;
    }
    record_part(to_part(r));
    if (r.failed() && !told_) {  // tell the coordinator now: this rank may not arrive soon
      told_ = true;
      send(c_.to_root, 0, kFailed, name_);
    }
  }

  void OnTestEnd(const TestInfo& t) override {
    const ::testing::TestResult& result = *t.result();
    Arrival a;
    a.index = ++tests_;
    a.name = full_name(t);
    a.status = result.Failed()    ? Status::failed
               : result.Skipped() ? Status::skipped
                                  : Status::passed;
    for (int i = 0; i < result.total_part_count(); ++i) {
      const TestPartResult& r = result.GetTestPartResult(i);
      if (r.type() != TestPartResult::kSuccess) {
        a.parts.push_back(to_part(r));
      }
    }
    if (a.status == Status::failed) a.flight = flight_if_a_collective_failed(a.name);
    a.groups = ccl_group_counts();
    const Status local = a.status;
    const Verdict v = exchange(a);
    injecting_ = true;
    if (c_.rank == 0) {
      report_on_rank0(v, local);
    } else {
      if (v.status == Status::failed && local != Status::failed) {
        inject(TestPartResult::kNonFatalFailure, t.file(), t.line(), v.summary);
      } else if (v.status == Status::skipped && local == Status::passed) {
        inject(TestPartResult::kSkip, t.file(), t.line(), v.summary);
      }
      std::printf("[meshtest] verdict %s: %s\n", full_name(t).c_str(), v.summary.c_str());
    }
    injecting_ = false;
    free_kept_comms();
    end_test(full_name(t));
  }

 private:
  /// Prints every rank's failures (or the skip) once and adds other ranks' to rank 0's result.
  void report_on_rank0(const Verdict& v, Status local) {
    std::string text;
    for (const TestPart& p : v.parts) {
      text += format_part(p, c_.size);
      if (v.status == Status::skipped && v.skipped.size() > 1) {
        text += fmt::format("(skipped on ranks {})\n", rank_list(v.skipped));
      }
      const std::string message = fmt::format("[rank {}/{}] {}", p.rank, c_.size, p.message);
      const char* file = p.file.empty() ? nullptr : p.file.c_str();
      if (v.status == Status::failed && p.rank != 0) {
        inject(TestPartResult::kNonFatalFailure, file, p.line, message);
      } else if (v.status == Status::skipped && local == Status::passed) {
        inject(TestPartResult::kSkip, file, p.line, message);
      }
    }
    text += v.flight;
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  }

  /// When a collective of this test failed or did not finish (the test threw out of it): the
  /// flight recorder, written to reports/flight/rank<r>.json and returned as JSON for rank 0's
  /// summary. Empty otherwise (a failed EXPECT on results is not a collective's failure).
  std::string flight_if_a_collective_failed(const std::string& name) const {
    const perf::FlightDump d = ccl_flight("a collective failed in test " + name, "test " + name);
    const bool failed = std::ranges::any_of(d.entries, [&](const perf::FlightEntry& e) {
      return e.seq >= first_seq_ && e.state != perf::FlightState::done;
    });
    if (!failed) return {};
    flight_dump(d.reason, d.activity);
    return perf::flight_json(d);
  }

  TestPart to_part(const TestPartResult& r) const {
    constexpr std::size_t kMaxMessage = 4000;
    std::string message = r.message();
    if (message.size() > kMaxMessage) {
      message = message.substr(0, kMaxMessage) + " [...]";
    }
    return TestPart{.rank = c_.rank,
                    .skip = r.skipped(),
                    .file = r.file_name() != nullptr ? r.file_name() : "",
                    .line = r.line_number(),
                    .message = std::move(message),
                    .also = {}};
  }

  const Config& c_ = config();
  std::int64_t tests_ = 0;
  bool injecting_ = false;
  std::uint64_t first_seq_ = 1;  // the first collective of the running test
  bool told_ = false;            // the coordinator knows of this test's failure here
  std::string name_;             // the running test (gtest's lock is held in OnTestPartResult)
};

}  // namespace

void install_listeners() {
  ::testing::TestEventListeners& listeners = UnitTest::GetInstance()->listeners();
  if (config().rank == 0) {
    listeners.Append(new PrinterFilter(listeners.Release(listeners.default_result_printer())));
  } else {
    delete listeners.Release(listeners.default_result_printer());
    delete listeners.Release(listeners.default_xml_generator());
    GTEST_FLAG_SET(output, "");
  }
  listeners.Append(new VerdictListener);
}

void agree_on_random_seed() {
  int seed = GTEST_FLAG_GET(random_seed);
  if (config().rank == 0 && seed == 0) {
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    seed = 1 + static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(now).count() %
                                99'999);
  }
  MESHTEST_MPI(MPI_Bcast(&seed, 1, MPI_INT, 0, MPI_COMM_WORLD));
  GTEST_FLAG_SET(random_seed, seed);
}

}  // namespace meshtest::dist::testing::detail
