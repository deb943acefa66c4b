// The one MPI error path: every MPI call goes through MESHTEST_MPI.
#pragma once

#include <mpi.h>

#include "src/core/error.hpp"

namespace meshtest::dist {

/// This process's rank in MPI_COMM_WORLD, or -1 before MPI_Init / after MPI_Finalize.
int world_rank_or_minus_one();

/// Throws meshtest::Error "[rank r] file:line: call failed: <MPI_Error_string>" unless rc is
/// MPI_SUCCESS.
void mpi_check(int rc, const char* call, const char* file, int line);

/// Throws meshtest::Error whose message starts with "[rank r] " (dist code names the rank).
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format("[rank {}] {}", world_rank_or_minus_one(),
                          fmt::format(f, std::forward<Args>(args)...)));
}

}  // namespace meshtest::dist

#define MESHTEST_MPI(call) ::meshtest::dist::mpi_check((call), #call, __FILE__, __LINE__)

/// Like MESHTEST_CHECK, with the rank in the message.
#define MESHTEST_DIST_CHECK(cond, ...)                \
  do {                                                \
    if (!(cond)) ::meshtest::dist::fail(__VA_ARGS__); \
  } while (0)
