// Trace: capture and replay of an op sequence.
#include "src/perf/trace.hpp"

#include "src/perf/profiler.hpp"

namespace meshtest::perf {

namespace {
thread_local Trace* t_active = nullptr;
}  // namespace

Tensor& Trace::input(Tensor t) { return tensors_.emplace_back(std::move(t)); }

Tensor& Trace::keep(Tensor t) { return tensors_.emplace_back(std::move(t)); }

Trace* Trace::active() { return t_active; }

void Trace::add_step(std::string_view op, const Tensor& in, const Tensor& out,
                     std::function<void()> run) {
  steps_.push_back(
      {std::string(op), in.bytes(), out.bytes(), in.nbytes(), out.nbytes(), std::move(run)});
}

bool Trace::owns(const std::byte* p, std::size_t n) const {
  if (n == 0) return true;
  for (const Tensor& t : tensors_) {
    if (t.bytes() == p && t.nbytes() == n) return true;
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
    const bool in_ok = owns(s.in, s.in_bytes), out_ok = owns(s.out, s.out_bytes);
    if (!in_ok || !out_ok) {
      const std::string op = s.op;
      steps_.clear();
      fail(
          "Trace::capture: step {} ({}) {} a tensor the trace does not own; pass trace inputs "
          "(Trace::input) or kept outputs (Trace::keep) to traced ops, and keep every output",
          i, op, in_ok ? "writes its output into" : "reads");
    }
  }
}

void Trace::replay() const {
  for (const Step& s : steps_) {
    OpScope scope(s.op, OpType::ccl);
    s.run();
  }
}

std::vector<std::string> Trace::ops() const {
  std::vector<std::string> out;
  for (const Step& s : steps_) out.push_back(s.op);
  return out;
}

}  // namespace meshtest::perf
