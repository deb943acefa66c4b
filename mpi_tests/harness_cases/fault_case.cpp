// The faults of mpi_tests/test_faults, run as child jobs (mpirun -np 4 fault_case
// --gtest_filter=Fault.<case>): rank 2 misbehaves while the other ranks go on. Before the
// faulty step every rank prints "[fault] rank r reaches the collective at <ms since epoch>"
// (to its rank log), so the launcher can time how fast the job ends after the last arrival, and
// "[fault] rank r ran its job-end hooks: <reason>" when it runs them.
#include <gtest/gtest.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "dist/ccl/all_gather.hpp"
#include "dist/ccl/all_reduce.hpp"
#include "dist/ccl/all_to_all.hpp"
#include "dist/testing/harness/fixtures.hpp"
#include "dist/testing/harness/harness.hpp"
#include "mpi_tests/harness_cases/fault_step.hpp"

namespace meshtest::dist::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kFaulty = 2;

bool faulty() { return world_rank() == kFaulty; }

Tensor ones(DType t = DType::f32, Shape s = Shape{4}) {
  Tensor x(s, t);
  x.fill(1);
  return x;
}

/// Collectives that go well, so the faulty one is not the first (its sequence number shows).
void warm_up(const MeshDevice& mesh) {
  for (int i = 0; i < 2; ++i) all_reduce(mesh, ones());
}

void reach() { harness_cases::print_reach(); }

/// Every rank says in its log when it runs its job-end hooks.
const bool g_printing_job_end = harness_cases::add_print_job_end();

[[gnu::noinline, gnu::no_sanitize_undefined]] void write_through_null() {
  volatile int* volatile p = nullptr;
  *p = 1;
}

// (a) - (f): rank 2 fails or stalls while the others wait in an all_reduce.

TEST_F(MeshTest, Throw) {
  warm_up(mesh());
  reach();
  if (faulty()) throw std::runtime_error("rank 2 throws");
  all_reduce(mesh(), ones());
}

TEST_F(MeshTest, Assert) {
  warm_up(mesh());
  reach();
  if (faulty()) {
    ASSERT_EQ(world_rank(), 0) << "rank 2 fails an ASSERT";
  }
  all_reduce(mesh(), ones());
}

TEST_F(MeshTest, Exit) {
  warm_up(mesh());
  reach();
  if (faulty()) std::exit(3);
  all_reduce(mesh(), ones());
}

TEST_F(MeshTest, SigKill) {
  warm_up(mesh());
  reach();
  if (faulty()) ::raise(SIGKILL);
  all_reduce(mesh(), ones());
}

TEST_F(MeshTest, Segv) {
  warm_up(mesh());
  reach();
  if (faulty()) write_through_null();
  all_reduce(mesh(), ones());
}

TEST_F(MeshTest, SleepPastDeadline) {
  warm_up(mesh());
  reach();
  if (faulty()) std::this_thread::sleep_for(600s);
  all_reduce(mesh(), ones());
}

// (g) - (j): a desync, which the collective itself reports on every device at once.

TEST_F(MeshTest, OtherCcl) {
  warm_up(mesh());
  reach();
  if (faulty()) {
    all_gather(mesh(), ones(), {.dim = 0});
  } else {
    all_reduce(mesh(), ones());
  }
}

TEST_F(MeshTest, OtherDtype) {
  warm_up(mesh());
  reach();
  all_reduce(mesh(), ones(faulty() ? DType::f64 : DType::f32));
}

TEST_F(MeshTest, OtherShape) {
  warm_up(mesh());
  reach();
  all_reduce(mesh(), ones(DType::f32, faulty() ? Shape{5} : Shape{4}));
}

TEST_F(MeshTest, AllToAllVCounts) {
  // Rows go to every device (split_dim 0) and the received pieces are concatenated along dim 1,
  // so they must agree in rows: rank 2 sends 2 rows to each device, the others 1.
  warm_up(mesh());
  const int p = mesh().size();
  const std::int64_t each = faulty() ? 2 : 1;
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(p), each);
  reach();
  all_to_all_v(mesh(), ones(DType::f32, Shape{each * p, 3}), counts,
               {.split_dim = 0, .concat_dim = 1});
}

TEST_F(MeshTest, SkipOne) {
  warm_up(mesh());
  reach();
  if (!faulty()) all_reduce(mesh(), ones());  // rank 2 skips this one
  all_reduce(mesh(), ones());
  all_reduce(mesh(), ones());
}

// (k): rank 2 blocks in a raw MPI_Recv that nobody matches; the others wait in an all_reduce.

TEST_F(MeshTest, RawRecv) {
  warm_up(mesh());
  reach();
  if (faulty()) {
    int v = 0;
    MPI_Recv(&v, 1, MPI_INT, 0, 4242, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  all_reduce(mesh(), ones());
}

// (l): rank 2 writes its pid to $MESHTEST_FAULT_PID_FILE and waits to be killed with kill -9
// from outside; the others wait in an all_reduce.

TEST_F(MeshTest, KilledFromOutside) {
  warm_up(mesh());
  reach();
  if (faulty()) {
    const char* file = std::getenv("MESHTEST_FAULT_PID_FILE");
    ASSERT_NE(file, nullptr) << "MESHTEST_FAULT_PID_FILE is not set";
    {
      std::ofstream out(std::string(file) + ".tmp");
      out << ::getpid() << "\n";
    }
    std::rename((std::string(file) + ".tmp").c_str(), file);
    std::this_thread::sleep_for(600s);
  }
  all_reduce(mesh(), ones());
}

}  // namespace
}  // namespace meshtest::dist::testing
