// Failure-path programs of the MPI test harness, run by mpi_tests/test_harness_jobs.cpp as child
// jobs (mpirun -np K harness_case --gtest_filter=...). Each test misbehaves on purpose; the
// MARK: comments let test_harness_jobs find their lines. Its main is the harness's with a
// preparation step that the environment can make fail on one rank (at the end).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include <mpi.h>

#include "dist/ccl/all_reduce.hpp"
#include "dist/testing/harness/fixtures.hpp"
#include "dist/testing/harness/harness.hpp"

namespace meshtest::dist::testing {
namespace {

using namespace std::chrono_literals;

int rank() { return world_rank(); }

/// One all_reduce of ones over the 1 x N mesh; returns N.
float sum_of_ones(const MeshDevice& mesh) {
  const Tensor ones = Tensor::from_vector<float>(Shape({4}), {1, 1, 1, 1});
  return all_reduce(mesh, ones).data<float>()[0];
}

// --- passing runs: only rank 0's gtest output appears; every rank prints ---

TEST_F(MeshTest, PassAllReduce) {
  std::printf("stdout hello from rank %d\n", rank());
  std::cerr << "stderr hello from rank " << rank() << "\n";
  EXPECT_EQ(sum_of_ones(mesh()), static_cast<float>(world_size()));
}

TEST_F(MeshTest, PassTwice) {
  EXPECT_EQ(sum_of_ones(mesh()), static_cast<float>(world_size()));
  EXPECT_EQ(sum_of_ones(mesh()), static_cast<float>(world_size()));
}

TEST(Pass, NoCollective) { EXPECT_GE(world_size(), 1); }

// --- failures that do not desynchronise the ranks: the run goes on ---

TEST_F(MeshTest, FailExpectOnRank2) {
  if (rank() == 2) {
    EXPECT_EQ(1 + 1, 3) << "expect failed on rank 2";  // MARK:expect_rank2
  }
  EXPECT_EQ(sum_of_ones(mesh()), static_cast<float>(world_size()));
}

TEST_F(MeshTest, FailOnRanks0And2) {
  if (rank() == 0) {
    ADD_FAILURE() << "first failure on rank 0";  // MARK:fail_rank0
  }
  if (rank() == 2) {
    ADD_FAILURE() << "second failure on rank 2";  // MARK:fail_rank2
  }
  EXPECT_EQ(sum_of_ones(mesh()), static_cast<float>(world_size()));
}

TEST(Fail, EarlyWhileOthersCompute) {
  if (rank() == 1) {
    FAIL() << "rank 1 fails at once";  // MARK:early_fail
  }
  std::this_thread::sleep_for(3500ms);  // no collective: not stuck, just slow
}

// --- failures that leave other ranks waiting inside a collective: the job ends ---

TEST_F(MeshTest, ThrowOnRank1) {
  if (rank() == 1) {
    throw std::runtime_error("boom on rank 1");
  }
  sum_of_ones(mesh());
}

TEST_F(MeshTest, AssertOnRank1ThenAllReduce) {
  if (rank() == 1) {
    ASSERT_EQ(rank(), 0) << "assert failed on rank 1";  // MARK:assert_rank1
  }
  sum_of_ones(mesh());
}

TEST(Fail, AssertOnRank1ThenRawMpiBarrier) {  // a collective the CCL log does not see
  if (rank() == 1) {
    FAIL() << "rank 1 fails before the barrier";
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_F(MeshTest, ExitOnRank1) {
  sum_of_ones(mesh());
  if (rank() == 1) {
    std::exit(3);
  }
  sum_of_ones(mesh());
}

TEST_F(MeshTest, ExitOnRank0) {
  if (rank() == 0) {
    std::exit(4);
  }
  sum_of_ones(mesh());
}

/// A real invalid write (volatile both ways: the store cannot be dropped); not instrumented
/// by UBSan, so a sanitizer build also gets the SIGSEGV.
[[gnu::noinline, gnu::no_sanitize_undefined]] void write_through_null() {
  volatile int* volatile p = nullptr;
  *p = 1;
}

TEST_F(MeshTest, SegvOnRank1) {
  if (rank() == 1) {
    write_through_null();
  }
  sum_of_ones(mesh());
}

/// Calls into a data array, as a call through a corrupted function pointer or vtable does: the
/// fault's pc is not code, and the report names the caller instead.
[[gnu::noinline]] void call_through_data_pointer() {
  static unsigned char not_code[16] = {};
  using Fn = void (*)();
  Fn fn = nullptr;
  void* data = not_code;
  std::memcpy(&fn, &data, sizeof fn);
  fn();
}

TEST_F(MeshTest, WildCallOnRank1) {
  if (rank() == 1) {
    call_through_data_pointer();
  }
  sum_of_ones(mesh());
}

TEST_F(MeshTest, AbortOnRank1) {
  if (rank() == 1) {
    std::abort();
  }
  sum_of_ones(mesh());
}

// --- the last rank fails: across simulated hosts it is on the second host whether ranks are
// mapped by node or by slot (mpi_tests/multinode/fault.sh) ---

TEST_F(MeshTest, AssertOnLastRankThenAllReduce) {
  sum_of_ones(mesh());
  if (rank() == world_size() - 1) {
    ASSERT_EQ(rank(), 0) << "assert failed on the last rank";
  }
  sum_of_ones(mesh());
}

TEST_F(MeshTest, LastRankKilled) {  // as by kill -9: no handler, no output, no goodbye
  sum_of_ones(mesh());
  if (rank() == world_size() - 1) {
    kill(getpid(), SIGKILL);
  }
  sum_of_ones(mesh());
}

// --- hangs: the deadline ends the job ---

TEST_F(MeshTest, SleepPastDeadline) {  // run with MESHTEST_TEST_TIMEOUT=3
  sum_of_ones(mesh());
  if (rank() == 1) {
    std::this_thread::sleep_for(60s);
  }
  sum_of_ones(mesh());
}

TEST_F(MeshTest, OneRankReturnsOthersWait) {  // a desync: rank 1 never calls the all_reduce
  MESHTEST_TIMEOUT(30);  // far beyond the pass watch's second or so: the job must not wait
  if (rank() == 1) {
    return;
  }
  sum_of_ones(mesh());
}

// A rank that leaves early is no desync for collectives of groups without it: the others run
// slow all_reduces (rank 0 sleeps first, so the rest wait inside) on a mesh of their own.
TEST(Subgroup, OneRankLeavesTheOthersGoOnWithoutIt) {
  MPI_Comm others = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank() == 1 ? MPI_UNDEFINED : 0, rank(), &others);
  if (rank() == 1) {
    return;
  }
  {
    const MeshDevice mesh = MeshDevice::line(others);
    for (int i = 0; i < 4; ++i) {
      if (rank() == 0) {
        std::this_thread::sleep_for(400ms);
      }
      EXPECT_EQ(sum_of_ones(mesh), static_cast<float>(world_size() - 1));
    }
  }
  MPI_Comm_free(&others);
}

// --- skips ---

TEST(Skip, AllRanks) { GTEST_SKIP() << "nothing to do here"; }  // MARK:skip_all

TEST(Skip, OneRank) {
  if (rank() == 2) {
    GTEST_SKIP() << "rank 2 lacks a feature";  // MARK:skip_rank2
  }
  EXPECT_TRUE(true);
}

TEST(Skip, OneRankSkipsAnotherFails) {
  if (rank() == 1) {
    GTEST_SKIP() << "rank 1 skips";
  }
  if (rank() == 2) {
    ADD_FAILURE() << "rank 2 fails";  // MARK:skip_and_fail
  }
}

}  // namespace
}  // namespace meshtest::dist::testing

// The harness's main with a preparation step, as meshtest::gpu_gtest_main has one: with
// MESHTEST_CASE_UNPREPARED_RANK=<r>, rank r answers that it is not prepared (and every test skips
// on every rank); MESHTEST_CASE_COUNT_PREPARED=1 prints each rank's call (prepare runs once per
// rank, collectively).
int main(int argc, char** argv) {
  return meshtest::dist::testing::run_all_tests(argc, argv, [] {
    const int rank = meshtest::dist::testing::world_rank();
    if (std::getenv("MESHTEST_CASE_COUNT_PREPARED") != nullptr) {
      std::fprintf(stderr, "[case] rank %d prepares\n", rank);
    }
    const char* unprepared = std::getenv("MESHTEST_CASE_UNPREPARED_RANK");
    if (unprepared != nullptr && std::atoi(unprepared) == rank) {
      return std::string("rank ") + unprepared + " is not prepared";
    }
    return std::string();
  });
}
