// mpi_subcommand: the main of an MPI subcommand — MPI up, run, bad input reported once (exit 2),
// a failure after communication started aborts the job (no rank left waiting).
#pragma once

#include <fmt/format.h>
#include <mpi.h>

#include <exception>
#include <string_view>

#include "dist/mesh/environment.hpp"

namespace meshtest::tools {

/// Passed to a subcommand's run: it sets `communicating` once its input checks (identical on
/// every rank, or agreed by all ranks) are done and it starts communicating.
struct MpiRunState {
  bool communicating = false;
};

/// Initialises MPI and returns run(argc, argv, env, state). An exception thrown while
/// !state.communicating is bad input that every rank saw alike: rank 0 prints
/// "<program>: error: <what>" and every rank returns 2. One thrown after is this rank's alone
/// (the others may be waiting in a collective): it prints "<program>: [rank r] error: <what>" and
/// calls MPI_Abort(MPI_COMM_WORLD, 3).
template <class Run>
int mpi_subcommand(std::string_view program, int argc, char** argv, Run&& run) {
  dist::Environment env(argc, argv);
  MpiRunState state;
  try {
    return run(argc, argv, env, state);
  } catch (const std::exception& e) {
    if (!state.communicating) {
      if (env.rank() == 0) fmt::print(stderr, "{}: error: {}\n", program, e.what());
      return 2;
    }
    fmt::print(stderr, "{}: [rank {}] error: {}\n", program, env.rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
  }
}

}  // namespace meshtest::tools
