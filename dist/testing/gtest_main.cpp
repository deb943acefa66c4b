// Minimal MPI gtest main (placeholder until the full harness lands): MPI init,
// only rank 0 prints, verdict agreed by an all-reduce.
#include <gtest/gtest.h>
#include <mpi.h>

#include "dist/mesh/environment.hpp"

int main(int argc, char** argv) {
  meshtest::dist::Environment env(argc, argv, MPI_THREAD_MULTIPLE);
  ::testing::InitGoogleTest(&argc, argv);
  if (env.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int local = RUN_ALL_TESTS();
  int global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return global;
}
