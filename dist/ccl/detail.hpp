// The common work of every collective, done once whatever path moves the data: option checks,
// the log scope, the profiler scope, metadata agreement across the axis group (MPI's datatypes
// and ops of meshtest's dtypes: mpi_types.hpp; block packing: block_layout.hpp).
#pragma once

#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dist/ccl/agreement.hpp"
#include "dist/ccl/block_layout.hpp"
#include "dist/ccl/ccl_arg.hpp"
#include "dist/ccl/ccl_log.hpp"
#include "dist/ccl/options.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/core/tensor.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/program_cache.hpp"
#include "src/perf/trace.hpp"

namespace meshtest::dist::detail {

class Path;

/// What agree() checks beyond the agreed options.
struct Agreement {
  bool tensors = true;    ///< dtype and shape must agree (false: only the options; broadcast)
  int free_dim = -1;      ///< a dim whose size may differ across devices (-1: none)
  std::string note = {};  ///< appended to a shape mismatch message: why the shapes must agree
  /// The output, when it exists before the agreement (all_reduce): the paths' agreement steps
  /// see it with the input (the shared-memory path announces one in the node arena, so it may
  /// write every device's output in place).
  const CclArg* out = nullptr;
  /// The call's option `path` (a path's name; empty: MESHTEST_CCL_PATH, else the registry's
  /// order; path_registry.hpp).
  std::string_view path = {};
};

/// One device's view of a call; gathered from every device of the axis group.
struct Meta {
  static constexpr std::size_t kMaxOptions = AgreedOptions::kMax;
  std::array<std::int64_t, Shape::kMaxRank> dims{};
  std::array<std::int64_t, kMaxOptions> options{};
  std::int32_t dtype = 0;
  std::int32_t rank = 0;
  std::int32_t device = 0;    ///< device id in the mesh
  std::int32_t error = 0;     ///< 1: the device found its own input invalid
  std::int32_t memory = 0;    ///< Memory::Kind of the device's operand
  std::int32_t ordinal = -1;  ///< its CUDA ordinal (cuda memory)
  std::array<char, 24> op{};  ///< the collective's name (truncated)
  std::uint64_t seq = 0;      ///< the call's count on the group's communicator

  Shape shape() const { return Shape(std::span(dims.data(), static_cast<std::size_t>(rank))); }
  DType dtype_value() const { return static_cast<DType>(dtype); }
  Memory where() const { return {.kind = static_cast<Memory::Kind>(memory), .ordinal = ordinal}; }
};

/// One collective call on one device: the front end's common work, for an operand in any
/// memory (CclArg). Construction checks the axis (locally: a bad axis cannot reach its group)
/// and opens the CclLogScope and the profiler scope. Local checks (the operand's own
/// CclArg::error, dim(), local_error()) are only recorded; agree() then makes sure the whole group
/// agrees, so every device throws the same meshtest::Error (naming the offending device) instead of
/// some devices hanging in the data exchange. Every collective starts with the same exchange,
/// whatever its kind: one MPI_Allreduce (max) of the call signature's hash, its complement and the
/// local error flag tells every device whether all signatures (op, axis, options, dtype, shape, the
/// kind of memory when it is not host, and the call's count on the group's communicator) are equal
/// and no device found an error; only when they are not does it gather every device's Meta
/// (MPI_Allgather) and validate the group in full, which gives the detailed error (or, e.g. for
/// uneven all_gather pieces, the per-device sizes). So a desync (a device calling another
/// collective, or skipping one, or passing host memory where the others pass GPU memory) is an
/// error in the collective where it happens, never a hang: "desync: device 2 called all_gather
/// as collective #5 of this group, but devices 0, 1, 3 called all_reduce #5", and each device
/// of the group dumps its flight recorder (ccl_log.hpp). A path may offer a faster agreement step
/// than the MPI_Allreduce on the group's communicator (Path::agree_step: the shared-memory path's
/// once its window exists), and options of its own (Path::agreed_options). The data then moves
/// through the chosen path or the first registered one that takes it (path_registry.hpp), by
/// run().
class Call {
 public:
  /// `op` and the fields' keys and texts must be string literals (see LogField).
  Call(std::string_view op, const MeshDevice& mesh, int axis, const CclArg& x,
       std::initializer_list<LogField> detail);
  /// The call on a host tensor (host_arg(x)).
  Call(std::string_view op, const MeshDevice& mesh, int axis, const Tensor& x,
       std::initializer_list<LogField> detail)
      : Call(op, mesh, axis, host_arg(x), detail) {}
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  std::string_view op() const { return op_; }
  const MeshDevice& mesh() const { return mesh_; }
  int axis() const { return axis_; }
  MPI_Comm comm() const { return comm_; }
  /// Where this device's operand lives (agreed across the group, by kind, after agree()).
  Memory memory() const { return x_.where; }
  /// The path chosen for the call (its option path or MESHTEST_CCL_PATH), or nullptr: the
  /// registry's order. Valid after agree().
  Path* chosen() const { return chosen_; }
  /// This device's operand.
  const CclArg& input() const { return x_; }
  int size() const { return size_; }    ///< devices in the axis group (p)
  int index() const { return index_; }  ///< this device's index in the group

  /// `dim` normalized for x; when out of range, records an error naming the value and the
  /// valid range for agree() to report, and returns 0.
  int dim(std::string_view name, int dim);
  /// Records an error found in this device's own input, for agree() to report.
  template <class... Args>
  void local_error(fmt::format_string<Args...> f, Args&&... args) {
    record(fmt::format(f, std::forward<Args>(args)...));
  }
  /// Collective: agrees on the signature (see the class comment), with `options`, the paths'
  /// options and the chosen path; when it differs, gathers every device's metadata and checks,
  /// identically on every device, the recorded local errors, then the agreed options, then
  /// dtype and shape (unless !a.tensors). Throws the same meshtest::Error on every device.
  void agree(std::initializer_list<AgreedOption> options, Agreement a = {});
  /// Every device's metadata in axis order (valid after agree()).
  const std::vector<Meta>& group() const { return group_; }
  /// True when agree() found every device's signature equal (so group() holds p copies of
  /// this device's metadata): every piece along the free dim has this device's size.
  bool uniform() const { return uniform_; }

  /// The plan of this call from the program cache (after agree()): keyed by the agreed
  /// signature, this device's axis index and, when the group is not uniform, every device's
  /// shape. `build` makes it on a miss.
  template <class P, class Build>
  std::shared_ptr<P> plan(Build&& build) {
    return perf::program_cache().get<P>(plan_key_, std::forward<Build>(build));
  }
  /// The call's output (the input itself for an in-place call), for the profiler record and
  /// the trace; the front end gives it before a path runs.
  void output(const CclArg& out);
  /// A path's data exchange (collective over the group; reads the input, writes the output):
  /// runs `exchange` and, while a perf::Trace is being captured, records it as a step that
  /// redoes this call from the input's buffer into the output's (host memory only: a trace
  /// captures host tensors; otherwise an Error before anything moves).
  template <class Exchange>
  void run(const Exchange& exchange) const {
    perf::Trace* t = perf::Trace::active();
    if (t != nullptr) check_traceable();
    exchange();
    if (t != nullptr) t->add_step(op_, *x_.tensor, *out_.tensor, exchange);
  }

  /// Throws meshtest::Error "[rank r] <op> on axis <a> of mesh <RxC>: <message>".
  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    fail_message(fmt::format(f, std::forward<Args>(args)...));
  }
  /// n as an MPI int count; throws (naming `what`) when it exceeds INT_MAX. Call it only with
  /// values every device computes identically from the agreed metadata.
  int count(std::int64_t n, std::string_view what) const;
  /// Counts and displacements of blocks of `elems` elements laid end to end, as MPI ints.
  std::pair<std::vector<int>, std::vector<int>> counts(std::span<const std::int64_t> elems,
                                                       std::string_view what) const;
  /// Throws "reduce op X is not supported for dtype Y" for avg on integers and for any
  /// reduction of u8. Deterministic once agree() has passed.
  void check_reduce_op(ReduceOp op, DType t) const;
  /// "device 3 (axis index 1)"
  std::string who(int index) const;
  /// This call's profiler record (op type ccl, input x, attribute axis): each CCL adds its
  /// own attributes; output() adds its output.
  perf::OpScope& perf() { return perf_; }

 private:
  void record(std::string message);
  Meta meta() const;  // this device's, without the device id, error flag, op and count
  void full_agree(std::span<const AgreedOption> options, const Agreement& a);
  bool agree_step(std::uint64_t h, const Agreement& a);
  void check_same_collective() const;
  void check_traceable() const;
  int device_of(int index) const;
  [[noreturn]] void fail_message(const std::string& message) const;

  std::string_view op_;
  const MeshDevice& mesh_;
  int axis_;
  CclArg x_;
  CclArg out_;
  MPI_Comm comm_;
  int size_ = 1;
  int index_ = 0;
  perf::OpScope perf_;
  std::array<LogField, 4> log_{};
  CclLogScope scope_;
  std::optional<std::string> error_;
  std::vector<Meta> group_;
  bool uniform_ = false;
  Path* chosen_ = nullptr;
  std::uint64_t seq_ = 0;  // this call's count on comm_
  perf::Signature plan_key_{""};
};

}  // namespace meshtest::dist::detail
