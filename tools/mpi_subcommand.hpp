// mpi_subcommand: the main of an MPI subcommand — MPI up, run, bad input reported once, exit 2.
#pragma once

#include <fmt/format.h>

#include <exception>
#include <string_view>

#include "dist/mesh/environment.hpp"

namespace meshtest::tools {

/// Initialises MPI, returns run(argc, argv, env); an exception is printed once (rank 0) as
/// "<program>: error: <what>" and gives exit code 2. `run` must validate its input identically
/// on every rank before communicating, so that every rank fails alike.
template <class Run>
int mpi_subcommand(std::string_view program, int argc, char** argv, Run&& run) {
  dist::Environment env(argc, argv);
  try {
    return run(argc, argv, env);
  } catch (const std::exception& e) {
    if (env.rank() == 0) fmt::print(stderr, "{}: error: {}\n", program, e.what());
    return 2;
  }
}

}  // namespace meshtest::tools
