// private_comm: a cached MPI_Comm_dup per communicator, freed with the communicator.
#include "dist/ccl/private_comm.hpp"

namespace meshtest::dist::detail {
namespace {

struct PrivateComm {
  MPI_Comm comm = MPI_COMM_NULL;
  PrivateComm() = default;
  PrivateComm(const PrivateComm&) = delete;
  PrivateComm& operator=(const PrivateComm&) = delete;
  ~PrivateComm() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

}  // namespace

MPI_Comm private_comm(MPI_Comm comm) {
  if (const PrivateComm* found = CommAttribute<PrivateComm>::find(comm)) return found->comm;
  auto dup = std::make_unique<PrivateComm>();
  MESHTEST_MPI(MPI_Comm_dup(comm, &dup->comm));
  MESHTEST_MPI(MPI_Comm_set_errhandler(dup->comm, MPI_ERRORS_RETURN));
  return CommAttribute<PrivateComm>::attach(comm, std::move(dup))->comm;
}

}  // namespace meshtest::dist::detail
