// Trace: capture and replay of an op sequence.
#include "src/perf/trace.hpp"

#include <optional>

#include "src/perf/profiler.hpp"

namespace meshtest::perf {

namespace {
thread_local Trace* t_active = nullptr;
}  // namespace

Tensor& Trace::input(Tensor t) { return tensors_.emplace_back(std::move(t)); }

Tensor& Trace::keep(Tensor t) { return tensors_.emplace_back(std::move(t)); }

Trace* Trace::active() { return t_active; }

void Trace::add_step(std::string_view op, OpType type, std::span<const Tensor* const> ins,
                     std::span<const Tensor* const> outs, std::function<void()> run) {
  MESHTEST_CHECK(type != OpType::signpost, "Trace::add_step: step {} has type signpost", op);
  const auto buffers = [&](std::span<const Tensor* const> ts, std::string_view what) {
    std::vector<Buffer> v;
    for (const Tensor* t : ts) {
      MESHTEST_CHECK(t != nullptr, "Trace::add_step: step {} has a null {}", op, what);
      v.push_back({t->bytes(), t->nbytes(), {.shape = t->shape(), .dtype = t->dtype()}});
    }
    return v;
  };
  steps_.push_back(
      {std::string(op), type, buffers(ins, "input"), buffers(outs, "output"), std::move(run)});
}

bool Trace::owns(const Buffer& b) const {
  if (b.bytes == 0) return true;
  for (const Tensor& t : tensors_) {
    if (t.bytes() == b.data && t.nbytes() == b.bytes) return true;
  }
  return false;
}

void Trace::capture(const std::function<void()>& f) {
  MESHTEST_CHECK(t_active == nullptr, "Trace::capture: another capture is active on this thread");
  MESHTEST_CHECK(steps_.empty(), "Trace::capture: this trace already holds {} steps",
                 steps_.size());
  t_active = this;
  try {
    f();
  } catch (...) {
    t_active = nullptr;
    steps_.clear();
    throw;
  }
  t_active = nullptr;
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    const Step& s = steps_[i];
    const auto check = [&](const std::vector<Buffer>& buffers, std::string_view what) {
      for (std::size_t j = 0; j < buffers.size(); ++j) {
        if (owns(buffers[j])) continue;
        const std::string op = s.op;
        const TensorInfo info = buffers[j].info;
        steps_.clear();
        fail(
            "Trace::capture: step {} ({}): its {} {} ({} {}) is a tensor the trace does not "
            "own; pass trace inputs (Trace::input) or kept outputs (Trace::keep) to traced ops, "
            "and keep every output",
            i, op, what, j, info.dtype, info.shape);
      }
    };
    check(s.ins, "input");
    check(s.outs, "output");
  }
}

void Trace::replay() const {
  for (const Step& s : steps_) {
    std::optional<OpScope> scope;
    if (s.type == OpType::compute) {
      scope.emplace(s.op, OpScope::fused);
    } else {
      scope.emplace(s.op, s.type);
    }
    for (const Buffer& b : s.ins) scope->input(b.info);
    for (const Buffer& b : s.outs) scope->output(b.info);
    s.run();
  }
}

std::vector<std::string> Trace::ops() const {
  std::vector<std::string> out;
  for (const Step& s : steps_) out.push_back(s.op);
  return out;
}

}  // namespace meshtest::perf
