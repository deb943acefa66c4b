// Trace: capture a function's op sequence once, with its plans and preallocated outputs; replay
// reruns the sequence on the same buffers without planning, validation or allocation.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/tensor.hpp"
#include "src/perf/op_record.hpp"

namespace meshtest::perf {

/// Usage (inputs and outputs live in the trace, at stable addresses):
///   perf::Trace t;
///   Tensor& x = t.input(Tensor(shape, dtype));        // fill x, now and before each replay
///   Tensor* y = nullptr;
///   t.capture([&] { y = &t.keep(dist::all_gather(mesh, x, {.dim = 1}));
///                   t.keep(dist::all_reduce(mesh, *y)); });
///   ... update x in place ...;  t.replay();          // results in the kept tensors
///
/// Ops that support tracing add a step while a capture is active: meshtest's CCLs (one input,
/// one output, OpType::ccl) and the traceable compute ops (qkv_rope, sdpa_sinks, experts:
/// several inputs and outputs, OpType::compute). A step's run redoes the op's work from its input
/// buffers into its output buffers, with the plan made at capture (tables, packing, MPI
/// requests) and without validation or allocation (experts, whose routing follows the input,
/// plans its permutation again); it reads the inputs' current contents, so
/// inputs updated in place between replays are seen. Replay results equal the eager results
/// bit for bit. Every step's output must be kept, and every step's input must be a trace input
/// or a kept output (a buffer is owned when a trace tensor has exactly its address and size);
/// capture throws Error otherwise.
///
/// Replay opens each step's profiler scope (OpScope) with the step's op code and type, so a
/// report shows compute steps as compute ops and CCL steps as CCLs, with the input and output
/// shapes seen at capture (compute steps as fused: scopes their run opens record nothing).
/// When the profiler recorded during the capture, each replayed record also carries the
/// captured call's attributes, bytes and flops, so a replay's report compares field for field
/// with an eager one (meshtest-report compare); otherwise those stay empty.
/// Replay of CCL steps is collective like the captured ops: every device of the group must
/// replay the same trace, and the mesh the ops ran on must outlive the trace (steps keep its
/// communicators).
class Trace {
 public:
  Trace() = default;
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  /// Moves t into the trace and returns it (stable address): an input the caller updates.
  Tensor& input(Tensor t);
  /// Moves an op's output into the trace (its buffer, which the step writes, stays put).
  Tensor& keep(Tensor t);
  /// Runs f once, eagerly, recording the steps of the ops it calls. Throws Error (and keeps no
  /// steps) when a step reads or writes a buffer that the trace does not own.
  void capture(const std::function<void()>& f);
  /// Reruns the captured steps in order.
  void replay() const;
  /// Captured steps, by op code.
  std::vector<std::string> ops() const;
  std::size_t size() const { return steps_.size(); }

  /// The trace being captured on this thread, or nullptr.
  static Trace* active();

  /// For the scope of a Paused, this thread's capture (if any) is set aside: the ops called
  /// meanwhile add no step and see no active trace (an op that records a step of its own for
  /// work it captures otherwise, e.g. a CUDA graph of GPU ops: dist/testing/gpu_fused.hpp).
  class Paused {
   public:
    Paused();
    ~Paused();
    Paused(const Paused&) = delete;
    Paused& operator=(const Paused&) = delete;

   private:
    Trace* paused_;
  };
  /// For ops: records a step of type `type` that reads the buffers of `ins` and writes those
  /// of `outs` by `run` (which must not touch other buffers). The tensors are looked at now
  /// (address, size, shape, dtype); they need not live on. Null pointers are not allowed.
  void add_step(std::string_view op, OpType type, std::span<const Tensor* const> ins,
                std::span<const Tensor* const> outs, std::function<void()> run);
  /// add_step for a brace list: add_step("qkv_rope", OpType::compute, {&x, &w}, {&q}, run).
  void add_step(std::string_view op, OpType type, std::initializer_list<const Tensor*> ins,
                std::initializer_list<const Tensor*> outs, std::function<void()> run) {
    add_step(op, type, std::span(ins.begin(), ins.size()), std::span(outs.begin(), outs.size()),
             std::move(run));
  }
  /// The run of a step that needs the tensors themselves (their shapes, or ops that take
  /// Tensor arguments): it gets the trace's tensors that own the step's input and output
  /// buffers, in the order they were given to add_tensor_step.
  using TensorRun =
      std::function<void(std::span<const Tensor* const> ins, std::span<Tensor* const> outs)>;
  /// add_step whose run gets the owning tensors (resolved at capture, after its ownership
  /// check; inputs and outputs must not be empty, as a zero-byte buffer has no owner). For an
  /// op whose work depends on its inputs' contents beyond their buffers (experts: the routing
  /// decides which expert GEMMs run and their sizes), the run may plan and allocate again.
  void add_tensor_step(std::string_view op, OpType type, std::span<const Tensor* const> ins,
                       std::span<const Tensor* const> outs, TensorRun run);
  /// For CCLs: a step of type ccl that reads `in` and writes `out` by `run`.
  void add_step(std::string_view op, const Tensor& in, const Tensor& out,
                std::function<void()> run) {
    add_step(op, OpType::ccl, {&in}, {&out}, std::move(run));
  }

 private:
  struct Buffer {
    const std::byte* data = nullptr;
    std::size_t bytes = 0;
    TensorInfo info;
  };
  struct Step {
    std::string op;
    OpType type = OpType::compute;
    std::vector<Buffer> ins, outs;
    std::function<void()> run;
    TensorRun tensor_run;                   // set instead of run by add_tensor_step
    std::vector<const Tensor*> in_tensors;  // tensor_run's arguments, resolved at capture
    std::vector<Tensor*> out_tensors;
    std::optional<OpRecord> record;  // the captured call's record (profiler on at capture)
  };
  Step make_step(std::string_view op, OpType type, std::span<const Tensor* const> ins,
                 std::span<const Tensor* const> outs) const;
  // The trace tensor that owns b, or nullptr (a zero-byte b is owned without one).
  Tensor* owner(const Buffer& b);
  bool owns(const Buffer& b) { return b.bytes == 0 || owner(b) != nullptr; }
  // Keeps, in steps_[i], the record of the op scope that added it, when that scope closes
  // during this capture.
  void keep_record_of(std::size_t i);

  std::deque<Tensor> tensors_;
  std::vector<Step> steps_;
  std::shared_ptr<bool> capturing_ = std::make_shared<bool>(false);
};

}  // namespace meshtest::perf
