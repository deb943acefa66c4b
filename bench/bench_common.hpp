// What the benchmarks share: option parsing with --help and exit code 2 on bad input, and
// nccl-tests' timing (calls back to back after a barrier, the slowest rank's average).
#pragma once

#include <fmt/format.h>
#include <mpi.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <string_view>

#include "dist/mesh/mpi_check.hpp"

namespace meshtest::bench {

/// True on the process that prints: MPI rank 0 by the launcher's environment (read before
/// MPI_Init, so --help and bad options need no MPI), or a process started without mpirun.
inline bool first_rank_by_env() {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  return rank == nullptr || std::string_view(rank) == "0";
}

/// Parses argv into the variables bound in `desc`, then runs `check` (which throws on bad
/// values). Returns 0 to go on, 1 after printing --help, 2 after printing a bad-input message
/// ("meshtest-bench <name>: ..."); only the first rank prints. Every rank parses alike.
inline int parse_options(std::string_view name, int argc, char** argv,
                         boost::program_options::options_description& desc,
                         const std::function<void()>& check) {
  namespace po = boost::program_options;
  const bool print = first_rank_by_env();
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
    if (vm.count("help") != 0) {
      if (print) std::cout << desc << "\n";
      return 1;
    }
    check();
  } catch (const std::exception& e) {
    if (print) {
      fmt::print(stderr, "meshtest-bench {}: {}\nTry 'meshtest-bench {} --help'.\n", name, e.what(),
                 name);
    }
    return 2;
  }
  return 0;
}

/// Runs body() (the part after MPI_Init) and returns its exit code. An exception escaping it
/// (a meshtest::Error from a collective, or from writing a file on rank 0 only) is printed as
/// "meshtest-bench <name>: [rank r] <message>" and ends the whole job with
/// MPI_Abort(MPI_COMM_WORLD, 2) — the other ranks may be waiting in a collective, so a plain
/// return could leave them hanging — instead of std::terminate.
template <class F>
int run_or_abort(std::string_view name, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const std::string_view what = e.what();
    const std::string tag = fmt::format("[rank {}] ", rank);
    fmt::print(stderr, "meshtest-bench {}: {}{}\n", name, what.starts_with(tag) ? "" : tag, what);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
  }
}

/// Seconds per call of f(): `iters` calls back to back after a barrier, the slowest rank's
/// average (nccl-tests' timing). Collective over comm.
template <class F>
double time_per_call(MPI_Comm comm, int iters, F&& f) {
  MESHTEST_MPI(MPI_Barrier(comm));
  const double t0 = MPI_Wtime();
  for (int i = 0; i < iters; ++i) f();
  double t = (MPI_Wtime() - t0) / iters, slowest = 0;
  MESHTEST_MPI(MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm));
  return slowest;
}

}  // namespace meshtest::bench
