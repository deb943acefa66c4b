// agree_or_throw through one MPI_Allreduce and, on failure, an MPI_Bcast of the message.
#include "dist/mesh/agree.hpp"

#include <climits>
#include <string>

#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist {

void agree_or_throw(MPI_Comm comm, std::string_view local_error_message) {
  int me = 0, n = 0;
  MESHTEST_MPI(MPI_Comm_rank(comm, &me));
  MESHTEST_MPI(MPI_Comm_size(comm, &n));
  const int mine = local_error_message.empty() ? INT_MAX : me;
  int first = INT_MAX;
  MESHTEST_MPI(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == INT_MAX) return;
  std::string message(local_error_message);
  int len = static_cast<int>(message.size());
  MESHTEST_MPI(MPI_Bcast(&len, 1, MPI_INT, first, comm));
  message.resize(static_cast<std::size_t>(len));
  MESHTEST_MPI(MPI_Bcast(message.data(), len, MPI_CHAR, first, comm));
  fail("device {} of {} rejected its input: {}", first, n, message);
}

std::string check_message(std::string_view what, const std::function<void()>& check) {
  try {
    check();
  } catch (const Error& e) {
    return what.empty() ? std::string(e.what()) : fmt::format("{}: {}", what, e.what());
  }
  return {};
}

void check_and_agree(MPI_Comm comm, std::string_view what, const std::function<void()>& check) {
  agree_or_throw(comm, check_message(what, check));
}

bool all_ranks(MPI_Comm comm, bool v) {
  int mine = v ? 1 : 0, all = 0;
  MESHTEST_MPI(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm));
  return all == 1;
}

}  // namespace meshtest::dist
