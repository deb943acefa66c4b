// mpi_subcommand: the main of an MPI subcommand — MPI up, run, bad input reported once (exit 2),
// a failure after communication started aborts the job (no rank left waiting).
#pragma once

#include <fmt/format.h>
#include <mpi.h>

#include <unistd.h>

#include <exception>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>

#include "dist/mesh/environment.hpp"
#include "src/core/error.hpp"

namespace meshtest::tools {

/// Passed to a subcommand's run: it sets `communicating` once its input checks (identical on
/// every rank, or agreed by all ranks) are done and it starts communicating.
struct MpiRunState {
  bool communicating = false;
};

/// Collective over MPI_COMM_WORLD, to call before communicating: rank 0 (the writer) checks
/// that every path can be written — its directory exists and is writable, and the path is
/// not a directory — and every rank throws the same meshtest::Error naming the first path that
/// cannot be, so a bad output path is bad input (exit 2), not an abort after the work.
inline void check_outputs_writable(std::initializer_list<std::string_view> paths, int rank) {
  std::string problem;
  if (rank == 0) {
    namespace fs = std::filesystem;
    for (std::string_view p : paths) {
      const fs::path path(p);
      const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
      std::error_code ec;
      if (!fs::is_directory(dir, ec)) {
        problem = fmt::format("cannot write {}: directory {} does not exist", p, dir.string());
      } else if (fs::is_directory(path, ec)) {
        problem = fmt::format("cannot write {}: it is a directory", p);
      } else if (::access(dir.c_str(), W_OK) != 0) {
        problem = fmt::format("cannot write {}: directory {} is not writable", p, dir.string());
      }
      if (!problem.empty()) break;
    }
  }
  int n = static_cast<int>(problem.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  problem.resize(static_cast<std::size_t>(n));
  MPI_Bcast(problem.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (n > 0) throw Error(problem);
}

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
