// path: the interface every CCL path implements (shared memory, node chain, MPI, a GPU path):
// the data exchange of each collective on raw buffers, after the front end has agreed and
// planned the call.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "dist/ccl/block_layout.hpp"
#include "dist/ccl/options.hpp"
#include "src/core/dtype.hpp"
#include "src/core/shape.hpp"
#include "src/perf/program_cache.hpp"

namespace meshtest::dist::detail {

class Call;

/// The kinds of path; each has its own slot of state in a plan.
enum class PathKind : std::uint8_t { shm, node_chain, mpi, device };
inline constexpr std::size_t kPathKinds = 4;

/// What a path keeps with one plan beyond the front end's geometry (MPI counts, workspaces).
struct PathState {
  virtual ~PathState() = default;
};

/// A front end's plan (cached by signature, perf::ProgramCache), with one slot of state per
/// kind of path: the path that runs the plan makes its state on the plan's first exchange and
/// reuses it on later calls and trace replays.
class CclPlan : public perf::Plan {
 public:
  /// The state of path kind k, made by make() (a std::unique_ptr<S>) when there is none yet.
  template <class S, class Make>
  S& state(PathKind k, Make&& make) {
    std::unique_ptr<PathState>& slot = states_[static_cast<std::size_t>(k)];
    if (!slot) slot = make();
    return static_cast<S&>(*slot);
  }

 private:
  std::array<std::unique_ptr<PathState>, kPathKinds> states_;
};

/// The geometry of all_gather and reduce_scatter: p blocks along a dim, block j of elems[j]
/// elements. all_gather: device j's piece, placed as block j of the output (layout: the blocks
/// of the output). reduce_scatter: block j of the input (layout: the blocks of the input) goes
/// to device j, reduced over the group.
struct BlockPlan : CclPlan {
  Shape out_shape;
  std::vector<std::int64_t> elems;
  BlockLayout layout;
  bool even = false;  ///< every block has the same size
};

struct AllGatherExchange {
  const std::byte* in = nullptr;  ///< this device's piece, contiguous
  std::byte* out = nullptr;       ///< not empty
  DType t = DType::f32;
  std::shared_ptr<BlockPlan> plan;
};

struct ReduceScatterExchange {
  const std::byte* in = nullptr;  ///< not empty
  std::byte* out = nullptr;
  DType t = DType::f32;
  ReduceOp op = ReduceOp::sum;
  Numerics numerics = Numerics::exact;  ///< the agreed numerics_option() (choose.hpp)
  std::shared_ptr<BlockPlan> plan;
};

/// all_reduce: out = every device's `in` reduced in axis order (out may be in).
struct AllReduceExchange {
  const std::byte* in = nullptr;
  std::byte* out = nullptr;
  std::int64_t n = 0;  ///< elements, > 0
  DType t = DType::f32;
  ReduceOp op = ReduceOp::sum;
  Numerics numerics = Numerics::exact;  ///< the agreed numerics_option() (choose.hpp)
  std::int64_t node_chain_mode = 0;     ///< the agreed all_reduce_path_option() (choose.hpp)
};

/// all_to_all and all_to_all_v's geometry: block j of the input (send: the blocks along the
/// split dim) goes to device j, where it becomes block i (i: the sender) of the output (recv:
/// the blocks along the concat dim).
struct AllToAllPlan : CclPlan {
  Shape out_shape;
  std::vector<std::int64_t> send_elems, recv_elems;  ///< this device's blocks, by device
  std::vector<std::int64_t> sent, received;          ///< every device's totals, by device
  BlockLayout send, recv;
  bool even = false;            ///< every block of the group has the same size
  std::size_t block_bytes = 0;  ///< even: the bytes of every block
};
struct AllToAllExchange {
  const std::byte* in = nullptr;
  std::byte* out = nullptr;
  DType t = DType::f32;
  std::shared_ptr<AllToAllPlan> plan;
};

/// broadcast: the root's `in` into every device's `out` (the root's too).
struct BroadcastExchange {
  const std::byte* in = nullptr;  ///< the root's operand (read on the root only)
  std::byte* out = nullptr;
  std::int64_t n = 0;  ///< elements, > 0
  DType t = DType::f32;
  int root = 0;  ///< axis index
};

/// One way of moving a collective's data. The front end (dist/ccl/<collective>.cpp) has
/// checked and agreed the call and planned its geometry; choose_paths (paths/choose.hpp) orders
/// the paths for the call, and the first that takes the exchange moves the data. Each exchange
/// is collective over the call's group: it returns false, having done nothing, when the path
/// declines the call (every device of the group must decide alike: from agreed metadata and
/// state made collectively), else moves the data through call.run() and returns true. A path
/// may throw Errors every device raises alike (a count beyond its limits). The default
/// implementations decline.
class Path {
 public:
  virtual ~Path() = default;
  virtual PathKind kind() const = 0;

  virtual bool all_gather(Call& /*call*/, const AllGatherExchange& /*x*/) { return false; }
  virtual bool reduce_scatter(Call& /*call*/, const ReduceScatterExchange& /*x*/) { return false; }
  virtual bool all_reduce(Call& /*call*/, const AllReduceExchange& /*x*/) { return false; }
  /// all_to_all and all_to_all_v (the same exchange of planned blocks).
  virtual bool all_to_all(Call& /*call*/, const AllToAllExchange& /*x*/) { return false; }
  virtual bool broadcast(Call& /*call*/, const BroadcastExchange& /*x*/) { return false; }
};

}  // namespace meshtest::dist::detail
