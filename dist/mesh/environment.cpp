// RAII MPI environment and the MPI error check.
#include "dist/mesh/environment.hpp"

#include "dist/mesh/mpi_check.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dist {

namespace {
const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "unknown";
  }
}
}  // namespace

bool mpi_active() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

int world_rank_or_minus_one() {
  if (!mpi_active()) return -1;
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void mpi_check(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
  fail("{}:{}: {} failed: {}", file, line, call,
       std::string_view(msg, static_cast<std::size_t>(len)));
}

Environment::Environment(int& argc, char**& argv, int required_thread_level) {
  int init = 0;
  MPI_Initialized(&init);
  if (init) {
    MPI_Query_thread(&provided_);
  } else {
    MESHTEST_MPI(MPI_Init_thread(&argc, &argv, required_thread_level, &provided_));
    owns_ = true;
  }
  MESHTEST_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  if (provided_ < required_thread_level && owns_) {
    owns_ = false;
    MPI_Finalize();
  }
  MESHTEST_CHECK(provided_ >= required_thread_level,
                 "the MPI library gives thread level {} but {} is required; use an MPI "
                 "built with thread support (Open MPI: ompi_info | grep -i thread)",
                 thread_level_name(provided_), thread_level_name(required_thread_level));
  // Profiler records carry the device id: the rank in MPI_COMM_WORLD.
  perf::set_device_id(rank());
}

Environment::~Environment() {
  if (owns_ && mpi_active()) MPI_Finalize();
}

int Environment::rank() const {
  int r = 0;
  MESHTEST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &r));
  return r;
}

int Environment::size() const {
  int n = 0;
  MESHTEST_MPI(MPI_Comm_size(MPI_COMM_WORLD, &n));
  return n;
}

}  // namespace meshtest::dist
