// The collectives that agreed on each communicator: a per-communicator count (in the hash every
// CCL exchanges first, so a device that skipped or added a collective disagrees) and the
// group's ranks in MPI_COMM_WORLD, listed for the harness (ccl_group_counts in ccl_log.hpp).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <vector>

namespace meshtest::dist::detail {

/// Attached to a communicator on its first collective (every device of the group counts the
/// same, as every device calls the same collectives in the same order). Every live one is
/// listed for ccl_group_counts; a freed one leaves its count there until
/// ccl_forget_freed_groups.
struct GroupCalls {
  explicit GroupCalls(MPI_Comm comm);
  ~GroupCalls();
  GroupCalls(const GroupCalls&) = delete;
  GroupCalls& operator=(const GroupCalls&) = delete;

  std::atomic<std::uint64_t> n = 0;  ///< read by ccl_group_counts on another thread
  const std::vector<int> members;    ///< the group's ranks in MPI_COMM_WORLD, group order
};

/// comm's GroupCalls, made on the first call (local: an attribute lookup afterwards).
GroupCalls& group_calls(MPI_Comm comm);

}  // namespace meshtest::dist::detail
