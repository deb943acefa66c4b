// choose: the one place that orders the paths of a collective's call, per communicator and
// memory, and the exchange that runs the call on the first path taking it.
#pragma once

#include <array>
#include <cstddef>

#include "dist/ccl/detail.hpp"
#include "dist/ccl/path.hpp"

namespace meshtest::dist::detail {

/// The paths a call tries, in order.
class PathOrder {
 public:
  PathOrder(std::initializer_list<Path*> paths);
  Path* const* begin() const { return paths_.data(); }
  Path* const* end() const { return paths_.data() + n_; }

 private:
  std::array<Path*, 2> paths_{};
  std::size_t n_ = 0;
};

/// The paths of `call` (after agree(), so that every device of the group orders them alike):
///  - an operand on a GPU: the device path alone (set_device_path; an Error naming the memory
///    when there is none);
///  - host memory on a communicator with a shared-memory group (Call::shm(): more than one
///    device, all on one node, MESHTEST_CCL_SHM not 0 on any): shared memory, then MPI for
///    what it declines (uneven pieces, all_to_all's large blocks, broadcast);
///  - otherwise the node chain (all_reduce over nodes of equal runs of consecutive ranks,
///    per MESHTEST_CCL_NODE_CHAIN: paths/node_chain/node_chain.hpp), then MPI.
/// The per-communicator state is made collectively where every device of the group is: the
/// shared-memory group by Call::agree after the group's first agreement, the node chain by its
/// path at the first all_reduce that may take it.
PathOrder choose_paths(const Call& call);

/// Installs the path of operands in device memory (the GPU side does; nullptr removes it) and
/// returns the previous one. Process-wide; not thread-safe against running collectives.
Path* set_device_path(Path* path);

/// The path setting all_reduce agrees on like an option, as every device must take the same
/// path: the node chain's mode (MESHTEST_CCL_NODE_CHAIN).
AgreedOption all_reduce_path_option();

/// The numerics a reduction agrees on like an option (every device must reduce alike), resolved
/// from the call's option n: Numerics::from_env takes MESHTEST_GPU_REDUCE (exact, the default
/// when unset, or nccl). Records a local error in `call` (reported by agree()) for a bad
/// MESHTEST_GPU_REDUCE on GPU memory and for nccl asked of host memory; host paths reduce
/// exactly whatever the value.
AgreedOption numerics_option(Call& call, Numerics n);

/// Throws: no path of `call`'s order took it.
[[noreturn]] void no_path(const Call& call);

/// Runs exchange `take` (a member of Path) with `x` on the first path of choose_paths(call)
/// that takes it.
template <class X>
void exchange(Call& call, bool (Path::*take)(Call&, const X&), const X& x) {
  for (Path* p : choose_paths(call)) {
    if ((p->*take)(call, x)) return;
  }
  no_path(call);
}

}  // namespace meshtest::dist::detail
