// private_comm: a cached MPI_Comm_dup per communicator, freed with the communicator.
#include "dist/ccl/private_comm.hpp"

#include <memory>

#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist::detail {
namespace {

int free_private(MPI_Comm, int, void* attr, void*) {
  auto* dup = static_cast<MPI_Comm*>(attr);
  const int rc = MPI_Comm_free(dup);
  delete dup;
  return rc;
}

int keyval() {
  static const int key = [] {
    int k = MPI_KEYVAL_INVALID;
    MESHTEST_MPI(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_private, &k, nullptr));
    return k;
  }();
  return key;
}

}  // namespace

MPI_Comm private_comm(MPI_Comm comm) {
  void* attr = nullptr;
  int found = 0;
  MESHTEST_MPI(MPI_Comm_get_attr(comm, keyval(), &attr, &found));
  if (found != 0) return *static_cast<MPI_Comm*>(attr);
  auto dup = std::make_unique<MPI_Comm>(MPI_COMM_NULL);
  MESHTEST_MPI(MPI_Comm_dup(comm, dup.get()));
  MESHTEST_MPI(MPI_Comm_set_errhandler(*dup, MPI_ERRORS_RETURN));
  MESHTEST_MPI(MPI_Comm_set_attr(comm, keyval(), dup.get()));
  return *dup.release();  // owned by the attribute from now on
}

}  // namespace meshtest::dist::detail
