// private_comm: a duplicate of a communicator for meshtest's own point-to-point traffic, and
// CommAttribute, the per-communicator objects (duplicate, shared-memory group, node chain)
// that the CCLs make once and keep until the communicator is freed.
#pragma once

#include <mpi.h>

#include <memory>

#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist::detail {

/// An object of type T kept as an attribute of a communicator (one MPI keyval per T): the
/// caller makes it once, collectively when its making is collective, and MPI deletes it when
/// the communicator is freed (the attribute's delete callback runs inside MPI_Comm_free, which
/// is collective, so ~T may free communicators and windows of the same group). Not copied to
/// duplicates of the communicator.
template <class T>
class CommAttribute {
 public:
  /// The object attached to comm, or nullptr. Local: an attribute lookup.
  static T* find(MPI_Comm comm) {
    void* attr = nullptr;
    int found = 0;
    MESHTEST_MPI(MPI_Comm_get_attr(comm, key(), &attr, &found));
    return found != 0 ? static_cast<T*>(attr) : nullptr;
  }
  /// Attaches `value` to comm (which must have none) and returns it, owned by comm from now on.
  static T* attach(MPI_Comm comm, std::unique_ptr<T> value) {
    MESHTEST_MPI(MPI_Comm_set_attr(comm, key(), value.get()));
    return value.release();
  }

 private:
  static int destroy(MPI_Comm, int, void* attr, void*) {
    delete static_cast<T*>(attr);
    return MPI_SUCCESS;
  }
  static int key() {
    static const int k = [] {
      int made = MPI_KEYVAL_INVALID;
      MESHTEST_MPI(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &destroy, &made, nullptr));
      return made;
    }();
    return k;
  }
};

/// A duplicate of `comm` (MPI_Comm_dup) kept as an attribute of `comm`: point-to-point
/// messages that a collective sends on it can never match a receive that user code posts on
/// `comm` itself (e.g. a wildcard MPI_ANY_SOURCE / MPI_ANY_TAG receive on mesh.comm()).
/// Collective over `comm` on the first call for that communicator (every device of the group
/// must make it at the same point, as they do inside a collective after its agreement);
/// later calls only look the attribute up. The duplicate is freed when `comm` is freed (its
/// attribute's delete callback) and is not copied to duplicates of `comm`.
MPI_Comm private_comm(MPI_Comm comm);

}  // namespace meshtest::dist::detail
