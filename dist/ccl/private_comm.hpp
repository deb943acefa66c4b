// private_comm: a duplicate of a communicator for meshtest's own point-to-point traffic.
#pragma once

#include <mpi.h>

namespace meshtest::dist::detail {

/// A duplicate of `comm` (MPI_Comm_dup) kept as an attribute of `comm`: point-to-point
/// messages that a collective sends on it can never match a receive that user code posts on
/// `comm` itself (e.g. a wildcard MPI_ANY_SOURCE / MPI_ANY_TAG receive on mesh.comm()).
/// Collective over `comm` on the first call for that communicator (every device of the group
/// must make it at the same point, as they do inside a collective after its agreement);
/// later calls only look the attribute up. The duplicate is freed when `comm` is freed (its
/// attribute's delete callback) and is not copied to duplicates of `comm`.
MPI_Comm private_comm(MPI_Comm comm);

}  // namespace meshtest::dist::detail
