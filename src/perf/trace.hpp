// Trace: capture a function's op sequence once, with its plans and preallocated outputs; replay
// reruns the sequence on the same buffers without planning, validation or allocation.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/tensor.hpp"

namespace meshtest::perf {

/// Usage (inputs and outputs live in the trace, at stable addresses):
///   perf::Trace t;
///   Tensor& x = t.input(Tensor(shape, dtype));        // fill x, now and before each replay
///   Tensor* y = nullptr;
///   t.capture([&] { y = &t.keep(dist::all_gather(mesh, x, {.dim = 1}));
///                   t.keep(dist::all_reduce(mesh, *y)); });
///   ... update x in place ...;  t.replay();          // results in the kept tensors
/// Ops that support tracing (meshtest's CCLs) add a step while a capture is active; every
/// step's output must be kept, and every step's input must be a trace input or a kept output.
/// Replay skips the ops' validation: it is collective like the captured ops, and every device
/// of the group must replay the same trace. The mesh the ops ran on must outlive the trace
/// (steps keep its communicators).
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
  /// For ops: records a step that reads `in` (nbytes) and writes `out` (nbytes) by `run`.
  void add_step(std::string_view op, const Tensor& in, const Tensor& out,
                std::function<void()> run);

 private:
  struct Step {
    std::string op;
    const std::byte* in = nullptr;
    const std::byte* out = nullptr;
    std::size_t in_bytes = 0, out_bytes = 0;
    std::function<void()> run;
  };
  bool owns(const std::byte* p, std::size_t n) const;

  std::deque<Tensor> tensors_;
  std::vector<Step> steps_;
};

}  // namespace meshtest::perf
