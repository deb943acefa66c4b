// private_comm: a duplicate of a communicator for meshtest's own point-to-point traffic, and
// CommAttribute, the per-communicator objects (duplicate, shared-memory group, node chain)
// that the CCLs make once and keep until the communicator is freed.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist::detail {

/// An object of type T kept as an attribute of a communicator (one MPI keyval per T): the
/// caller makes it once, collectively when its making is collective, and MPI deletes it when
/// the communicator is freed (the attribute's delete callback runs inside MPI_Comm_free, which
/// is collective, so ~T may free communicators and windows of the same group). Not copied to
/// duplicates of the communicator.
///
/// find() remembers its last answer per thread (the paths ask several times per call, and
/// MPI_Comm_get_attr takes a lock: about 0.1 us each): every attach and every delete moves a
/// generation, which makes every remembered answer stale, so a freed communicator's handle,
/// reused by MPI, is looked up anew.
template <class T>
class CommAttribute {
 public:
  /// The object attached to comm, or nullptr. Local.
  static T* find(MPI_Comm comm) {
    Last& last = remembered();
    const std::uint64_t gen = generation().load(std::memory_order_acquire);
    if (last.gen == gen && last.comm == comm) return last.value;
    void* attr = nullptr;
    int found = 0;
    MESHTEST_MPI(MPI_Comm_get_attr(comm, key(), &attr, &found));
    last = {.comm = comm, .value = found != 0 ? static_cast<T*>(attr) : nullptr, .gen = gen};
    return last.value;
  }
  /// Attaches `value` to comm (which must have none) and returns it, owned by comm from now on.
  static T* attach(MPI_Comm comm, std::unique_ptr<T> value) {
    MESHTEST_MPI(MPI_Comm_set_attr(comm, key(), value.get()));
    generation().fetch_add(1, std::memory_order_acq_rel);
    return value.release();
  }

 private:
  struct Last {
    MPI_Comm comm = MPI_COMM_NULL;
    T* value = nullptr;
    std::uint64_t gen = ~std::uint64_t{0};  // never current: the first find looks up
  };
  static Last& remembered() {
    thread_local Last last;
    return last;
  }
  static std::atomic<std::uint64_t>& generation() {
    static std::atomic<std::uint64_t> gen{0};
    return gen;
  }
  static int destroy(MPI_Comm, int, void* attr, void*) {
    generation().fetch_add(1, std::memory_order_acq_rel);
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
