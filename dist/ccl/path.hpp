// path: the seam between the CCLs' front end and the paths that move their data (shared
// memory, the node chain, MPI, a GPU path, a test's own): the interface every path implements,
// the data exchange of each collective on raw buffers after the front end has agreed and planned
// the call, and the registry the front end asks for the paths of a call.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dist/ccl/agreement.hpp"
#include "dist/ccl/block_layout.hpp"
#include "dist/ccl/ccl_arg.hpp"
#include "dist/ccl/options.hpp"
#include "src/core/dtype.hpp"
#include "src/core/shape.hpp"
#include "src/perf/program_cache.hpp"

namespace meshtest::dist {

/// What one device has moved through a path on one communicator so far, where the path counts
/// it (the shared-memory path does: its steps and the bytes it wrote to and read from shared
/// memory).
struct PathTraffic {
  std::uint64_t steps = 0, written = 0, read = 0;
};

}  // namespace meshtest::dist

namespace meshtest::dist::detail {

class Call;
class Path;

/// What a path keeps with one plan beyond the front end's geometry (MPI counts, workspaces).
struct PathState {
  virtual ~PathState() = default;
};

/// A front end's plan (cached by signature, perf::ProgramCache), with a slot of state per path:
/// the path that runs the plan makes its state on the plan's first exchange and reuses it on
/// later calls and trace replays.
class CclPlan : public perf::Plan {
 public:
  /// The state of `path`, made by make() (a std::unique_ptr<S>) when there is none yet.
  template <class S, class Make>
  S& state(const Path* path, Make&& make) {
    for (auto& [owner, slot] : states_) {
      if (owner == path) return static_cast<S&>(*slot);
    }
    states_.emplace_back(path, make());
    return static_cast<S&>(*states_.back().second);
  }

 private:
  std::vector<std::pair<const Path*, std::unique_ptr<PathState>>> states_;
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
  Numerics numerics = Numerics::exact;  ///< the agreed numerics_option() (numerics.hpp)
  std::shared_ptr<BlockPlan> plan;
};

/// all_reduce: out = every device's `in` reduced in axis order (out may be in).
struct AllReduceExchange {
  const std::byte* in = nullptr;
  std::byte* out = nullptr;
  std::int64_t n = 0;  ///< elements, > 0
  DType t = DType::f32;
  ReduceOp op = ReduceOp::sum;
  Numerics numerics = Numerics::exact;  ///< the agreed numerics_option() (numerics.hpp)
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

/// Where a path applies: within one node only, or across any group.
enum class Reach : std::uint8_t { one_node, any };

/// What a path is: the front end orders the registered paths by these and never names one.
struct PathInfo {
  std::string_view name;  ///< unique, a string literal: "mpi", "shm", ... (MESHTEST_CCL_PATH)
  Memory::Kind memory = Memory::Kind::host;  ///< the memory of the operands it moves
  Reach reach = Reach::any;
  int priority = 0;  ///< among the paths of one memory, higher is tried first
};

/// One way of moving a collective's data. The front end (dist/ccl/<collective>.cpp) has checked
/// and agreed the call and planned its geometry; exchange() (path_registry.hpp) tries the
/// registered paths of the operand's memory that apply to the call, in priority order, and the
/// first that takes the exchange moves the data. Each exchange is collective over the call's
/// group: it returns false, having done nothing, when the path declines the call (every device of
/// the group must decide alike: from agreed metadata and state made collectively), else moves the
/// data through call.run() and returns true. A path may throw Errors every device raises alike (a
/// count beyond its limits). The default implementations decline.
///
/// What a path must agree across the group travels through its own hooks, never as fields of
/// the generic call: options of its own in the call's signature (agreed_options), a faster
/// agreement step with data of its own (agree_step, e.g. the shared-memory window and the node
/// arena's offsets) and collective set-up once a group has agreed (agreed).
class Path {
 public:
  virtual ~Path() = default;
  virtual const PathInfo& info() const = 0;
  std::string_view name() const { return info().name; }

  /// Whether the path may take calls of this group (after agree(); alike on every device of the
  /// group): e.g. the shared-memory path where the group has its shared-memory window.
  virtual bool applies(const Call& /*call*/) const { return true; }
  /// Options of the path that every device must pass alike in a call of `op` ("all_reduce",
  /// ...), whatever the call's memory, appended to `out`. The exchange reads its setting again
  /// locally: the agreement has made it equal across the group.
  virtual void agreed_options(std::string_view /*op*/, AgreedOptions& /*out*/) const {}
  /// A faster agreement step than the front end's MPI_Allreduce where the path has the means on
  /// `comm` (called on every device of a group of more than one; the answer must be alike on
  /// every device): max-agrees `hash` and `error` over the group and returns whether every hash
  /// was equal and no device had an error; nullopt leaves the step to the next path or to MPI.
  /// `in` and `out` (out may be null) are this device's operands, for data of the path's own.
  virtual std::optional<bool> agree_step(MPI_Comm /*comm*/, std::uint64_t /*hash*/, bool /*error*/,
                                         const CclArg& /*in*/, const CclArg* /*out*/) {
    return std::nullopt;
  }
  /// Collective over `comm`: its devices have just agreed on a call of tensors over MPI (the
  /// first point where every device of the group is known to be present); set-up that needs them
  /// all (once per communicator) goes here.
  virtual void agreed(MPI_Comm /*comm*/) {}

  /// For reports (path_reports): what the path holds for the group of `comm` in one line ("the
  /// shared-memory ring of 8 devices"), or empty while it holds nothing there (nothing set up yet,
  /// turned off, or not its kind of group). Local.
  virtual std::string status(MPI_Comm /*comm*/) const { return {}; }
  /// What this device has moved through the path on `comm`, where the path counts it. Local.
  virtual std::optional<PathTraffic> traffic(MPI_Comm /*comm*/) const { return std::nullopt; }

  virtual bool all_gather(Call& /*call*/, const AllGatherExchange& /*x*/) { return false; }
  virtual bool reduce_scatter(Call& /*call*/, const ReduceScatterExchange& /*x*/) { return false; }
  virtual bool all_reduce(Call& /*call*/, const AllReduceExchange& /*x*/) { return false; }
  /// all_to_all and all_to_all_v (the same exchange of planned blocks).
  virtual bool all_to_all(Call& /*call*/, const AllToAllExchange& /*x*/) { return false; }
  virtual bool broadcast(Call& /*call*/, const BroadcastExchange& /*x*/) { return false; }
};

}  // namespace meshtest::dist::detail
