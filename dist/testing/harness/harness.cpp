// run_all_tests: MPI and the control channel around RUN_ALL_TESTS.
#include "dist/testing/harness/harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "dist/ccl/arena/arena.hpp"
#include "dist/ccl/ccl_log.hpp"
#include "dist/mesh/environment.hpp"
#include "dist/mesh/job_end.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "dist/testing/harness/control.hpp"
#include "dist/testing/harness/crash.hpp"
#include "dist/testing/harness/flags.hpp"
#include "dist/testing/harness/listener.hpp"
#include "dist/testing/harness/output.hpp"
#include "src/core/eigen_cache.hpp"

namespace meshtest::dist::testing {

namespace {

using detail::config;

/// Reads the harness's environment variables and dups the control communicators.
void configure() {
  detail::Config& c = config();
  c.rank = world_rank();
  c.size = world_size();
  c.default_timeout = detail::env_seconds("MESHTEST_TEST_TIMEOUT", c.default_timeout);
  c.failure_grace = detail::env_seconds("MESHTEST_FAILURE_GRACE", c.failure_grace);
  set_flight_dir(std::filesystem::path(detail::reports_dir()) / "flight", detail::activity);
  for (MPI_Comm* comm : {&c.to_root, &c.from_root}) {
    MESHTEST_MPI(MPI_Comm_dup(MPI_COMM_WORLD, comm));
    MESHTEST_MPI(MPI_Comm_set_errhandler(*comm, MPI_ERRORS_RETURN));
  }
}

/// prepare() on every rank; the lowest rank's reason when any rank has one, else "".
std::string agree_on_preparation(const PrepareRanks& prepare) {
  const std::string mine = prepare ? prepare() : std::string();
  const int rank = config().rank;
  int first = 0;
  const int candidate = mine.empty() ? config().size : rank;
  MESHTEST_MPI(MPI_Allreduce(&candidate, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (first == config().size) return {};
  std::string reason = rank == first ? mine : std::string();
  int length = static_cast<int>(reason.size());
  MESHTEST_MPI(MPI_Bcast(&length, 1, MPI_INT, first, MPI_COMM_WORLD));
  reason.resize(static_cast<std::size_t>(length));
  MESHTEST_MPI(MPI_Bcast(reason.data(), length, MPI_CHAR, first, MPI_COMM_WORLD));
  return reason;
}

/// Rank 0's last line when every test that ran skipped (its result holds the agreed verdicts),
/// naming the CTest test (`ctest_name`, "" outside CTest).
void print_when_every_test_skipped(const std::string& ctest_name) {
  const std::string what = ctest_name.empty() ? "every test" : "every test of " + ctest_name;
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  if (u.test_to_run_count() == 0 || u.skipped_test_count() != u.test_to_run_count()) return;
  for (int i = 0; i < u.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *u.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j) {
      const ::testing::TestResult& result = *suite.GetTestInfo(j)->result();
      for (int k = 0; k < result.total_part_count(); ++k) {
        if (result.GetTestPartResult(k).skipped()) {
          std::printf("[meshtest] %s skipped: %s\n", what.c_str(),
                      result.GetTestPartResult(k).message());
          return;
        }
      }
    }
  }
  std::printf("[meshtest] %s skipped\n", what.c_str());
}

int run(int& argc, char** argv, const PrepareRanks& prepare) {
  // The CTest test this job is (meshtest_add_mpi_test), not inherited by jobs it starts.
  std::string ctest_name;
  if (const char* name = std::getenv("MESHTEST_CTEST_NAME")) ctest_name = name;
  ::unsetenv("MESHTEST_CTEST_NAME");
  // Another processor's GEMM blocking; a malformed value throws on every rank alike.
  const std::optional<CacheSizes> cache = apply_eigen_cache_env();
  configure();
  const detail::Config& c = config();
  const bool redirected = detail::setup_rank_output(c.rank, c.size);
  if (c.rank == 0 && cache) {
    std::printf("[meshtest] Eigen's GEMM blocking as for caches of %s (MESHTEST_EIGEN_CACHE)\n",
                cache->str().c_str());
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (detail::asks_for_help(argc, argv)) {
    std::fputs(detail::harness_flags_help().c_str(), stdout);  // after GoogleTest's help
  } else {
    detail::take_harness_flags(argc, argv);  // a malformed one throws on every rank alike
  }
  if (!detail::asks_for_help(argc, argv) && !GTEST_FLAG_GET(list_tests)) {
    config().skip_every_test = agree_on_preparation(prepare);
  }
  detail::install_listeners();
  detail::agree_on_random_seed();
  detail::install_crash_handlers(c.rank, c.size, detail::original_stderr_fd(), redirected);
  detail::start_control_thread();
  detail::arm_exit_hook();

  const int local = RUN_ALL_TESTS();
  detail::Arrival done;
  done.finish = true;
  done.status = local != 0 ? detail::Status::failed : detail::Status::passed;
  done.exit_code = local;
  const detail::Verdict final = detail::exchange(done);
  detail::stop_control_thread();
  detail::disarm_exit_hook();
  if (c.rank == 0 && final.exit_code == 0) print_when_every_test_skipped(ctest_name);
  if (c.rank == 0 && final.exit_code != 0 && local == 0) {
    std::printf("[meshtest] %s (see %s/logs/rank<r>.log)\n", final.summary.c_str(),
                detail::reports_dir().c_str());
  }
  if (c.rank != 0) {
    std::printf("[meshtest] rank %d exits with code %d\n", c.rank, final.exit_code);
  }
  std::fflush(stdout);
  for (MPI_Comm* comm : {&config().to_root, &config().from_root}) {
    MPI_Comm_free(comm);
  }
  return final.exit_code;
}

/// MESHTEST_CCL_ARENA=<bytes per device> (K, M, G suffixes): every tensor of the binary in the
/// node arena while it has room (NodeArena::use_for_all_tensors), so that its CCLs run on the
/// in-place path. Collective; throws Error on a bad value (every rank reads the same one).
void open_arena_from_environment() {
  const char* v = std::getenv("MESHTEST_CCL_ARENA");
  if (v == nullptr || *v == 0) return;
  char* end = nullptr;
  const double n = std::strtod(v, &end);
  const std::string_view unit(end);
  const double scale = unit.empty()  ? 1
                       : unit == "K" ? 1 << 10
                       : unit == "M" ? 1 << 20
                       : unit == "G" ? 1 << 30
                                     : -1;
  MESHTEST_CHECK(n > 0 && scale > 0 && n * scale < 1e12,
                 "MESHTEST_CCL_ARENA is '{}'; expected bytes per device such as 256M", v);
  NodeArena::open(static_cast<std::size_t>(n * scale));
  NodeArena::use_for_all_tensors();
}

}  // namespace

int run_all_tests(int& argc, char** argv, const PrepareRanks& prepare) {
  std::optional<Environment> env;
  try {
    env.emplace(argc, argv, MPI_THREAD_MULTIPLE);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[meshtest] cannot start the MPI test harness: %s\n", e.what());
    return 1;
  }
  try {
    open_arena_from_environment();
    return run(argc, argv, prepare);
  } catch (const std::exception& e) {
    detail::disarm_exit_hook();
    const std::string message = fmt::format("[rank {}/{}] meshtest harness error: {}", world_rank(),
                                            world_size(), e.what());
    detail::write_original_stderr(message + "\n");
    run_job_end_hooks(message);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

void set_test_timeout(std::chrono::milliseconds timeout) { detail::set_timeout(timeout); }

std::chrono::milliseconds default_test_timeout() { return config().default_timeout; }

int world_rank() {
  int r = 0;
  MESHTEST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &r));
  return r;
}

int world_size() {
  int n = 0;
  MESHTEST_MPI(MPI_Comm_size(MPI_COMM_WORLD, &n));
  return n;
}

}  // namespace meshtest::dist::testing
