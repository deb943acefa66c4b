// Trace: capture and replay of an op sequence.
#include "src/perf/trace.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "src/perf/profiler.hpp"

namespace meshtest::perf {

namespace {
thread_local Trace* t_active = nullptr;
}  // namespace

Tensor& Trace::input(Tensor t) { return tensors_.emplace_back(std::move(t)); }

Tensor& Trace::keep(Tensor t) { return tensors_.emplace_back(std::move(t)); }

Trace* Trace::active() { return t_active; }

Trace::Paused::Paused() : paused_(std::exchange(t_active, nullptr)) {}
Trace::Paused::~Paused() { t_active = paused_; }

Trace::Step Trace::make_step(std::string_view op, OpType type, std::span<const Tensor* const> ins,
                             std::span<const Tensor* const> outs) const {
  MESHTEST_CHECK(type != OpType::signpost, "Trace::add_step: step {} has type signpost", op);
  const auto buffers = [&](std::span<const Tensor* const> ts, std::string_view what) {
    std::vector<Buffer> v;
    for (const Tensor* t : ts) {
      MESHTEST_CHECK(t != nullptr, "Trace::add_step: step {} has a null {}", op, what);
      v.push_back({t->bytes(), t->nbytes(), {.shape = t->shape(), .dtype = t->dtype()}});
    }
    return v;
  };
  Step s;
  s.op = std::string(op);
  s.type = type;
  s.ins = buffers(ins, "input");
  s.outs = buffers(outs, "output");
  return s;
}

void Trace::add_step(std::string_view op, OpType type, std::span<const Tensor* const> ins,
                     std::span<const Tensor* const> outs, std::function<void()> run) {
  Step s = make_step(op, type, ins, outs);
  s.run = std::move(run);
  steps_.push_back(std::move(s));
  keep_record_of(steps_.size() - 1);
}

void Trace::add_tensor_step(std::string_view op, OpType type, std::span<const Tensor* const> ins,
                            std::span<const Tensor* const> outs, TensorRun run) {
  Step s = make_step(op, type, ins, outs);
  const auto empty = [](const Buffer& b) { return b.bytes == 0; };
  MESHTEST_CHECK(std::none_of(s.ins.begin(), s.ins.end(), empty) &&
                     std::none_of(s.outs.begin(), s.outs.end(), empty),
                 "Trace::add_tensor_step: step {} has an empty input or output (it has no owner "
                 "to pass to its run)",
                 op);
  s.tensor_run = std::move(run);
  steps_.push_back(std::move(s));
  keep_record_of(steps_.size() - 1);
}

void Trace::keep_record_of(std::size_t i) {
  // The op adds its step inside its own (innermost) scope, which closes before capture ends;
  // `capturing` guards against a scope that outlives the capture.
  OpScope::when_innermost_closes([this, i, capturing = capturing_](const OpRecord& r) {
    if (*capturing && i < steps_.size()) steps_[i].record = r;
  });
}

Tensor* Trace::owner(const Buffer& b) {
  if (b.bytes == 0) return nullptr;
  for (Tensor& t : tensors_) {
    if (t.bytes() == b.data && t.nbytes() == b.bytes) return &t;
  }
  return nullptr;
}

void Trace::capture(const std::function<void()>& f) {
  MESHTEST_CHECK(t_active == nullptr, "Trace::capture: another capture is active on this thread");
  MESHTEST_CHECK(steps_.empty(), "Trace::capture: this trace already holds {} steps",
                 steps_.size());
  t_active = this;
  capturing_ = std::make_shared<bool>(true);
  try {
    f();
  } catch (...) {
    t_active = nullptr;
    *capturing_ = false;
    steps_.clear();
    throw;
  }
  t_active = nullptr;
  *capturing_ = false;
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
  for (Step& s : steps_) {
    if (!s.tensor_run) continue;
    for (const Buffer& b : s.ins) s.in_tensors.push_back(owner(b));
    for (const Buffer& b : s.outs) s.out_tensors.push_back(owner(b));
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
    if (s.record) scope->like(*s.record);
    if (s.tensor_run) {
      s.tensor_run(s.in_tensors, s.out_tensors);
    } else {
      s.run();
    }
  }
}

std::vector<std::string> Trace::ops() const {
  std::vector<std::string> out;
  for (const Step& s : steps_) out.push_back(s.op);
  return out;
}

}  // namespace meshtest::perf
