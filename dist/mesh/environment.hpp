// Environment: RAII MPI_Init_thread / MPI_Finalize.
#pragma once

#include <mpi.h>

namespace meshtest::dist {

/// Initializes MPI on construction and finalizes it on destruction (unless
/// MPI was already initialized by someone else, in which case it does neither).
/// Throws meshtest::Error if the MPI library cannot give the thread level asked
/// for (the test harness's watchdog needs MPI_THREAD_MULTIPLE).
class Environment {
 public:
  Environment(int& argc, char**& argv, int required_thread_level = MPI_THREAD_SINGLE);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

  int rank() const;
  int size() const;
  int thread_level() const { return provided_; }

 private:
  bool owns_ = false;
  int provided_ = MPI_THREAD_SINGLE;
};

/// True between MPI_Init and MPI_Finalize.
bool mpi_active();

}  // namespace meshtest::dist
