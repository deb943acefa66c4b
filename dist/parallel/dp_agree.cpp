// agree_or_throw through one MPI_Allreduce and, on failure, one MPI_Bcast of the message.
#include "dist/parallel/dp_agree.hpp"

#include <climits>
#include <string>

#include "dist/mesh/mpi_check.hpp"
#include "src/core/error.hpp"

namespace meshtest::dist {

void agree_or_throw(const MeshDevice& mesh, int axis, std::string_view what,
                    const std::function<void()>& check) {
  std::string message;
  int mine = INT_MAX;
  try {
    check();
  } catch (const Error& e) {
    message = e.what();
    mine = mesh.axis_index(axis);
  }
  const MPI_Comm comm = mesh.comm(axis);
  int first = INT_MAX;
  MESHTEST_MPI(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == INT_MAX) return;
  int len = static_cast<int>(message.size());
  MESHTEST_MPI(MPI_Bcast(&len, 1, MPI_INT, first, comm));
  message.resize(static_cast<std::size_t>(len));
  MESHTEST_MPI(MPI_Bcast(message.data(), len, MPI_CHAR, first, comm));
  fail("{}: device {} of the axis: {}", what, first, message);
}

bool all_devices(const MeshDevice& mesh, int axis, bool v) {
  int mine = v ? 1 : 0, all = 0;
  MESHTEST_MPI(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, mesh.comm(axis)));
  return all == 1;
}

}  // namespace meshtest::dist
