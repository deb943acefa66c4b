// The per-op profiler: records, signposts, OpScope.
#include "src/perf/profiler.hpp"

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <tuple>

namespace meshtest::perf {

namespace {
std::atomic<bool> g_enabled{false};
std::atomic<int> g_device{0};
std::mutex g_mutex;
std::vector<OpRecord> g_records;  // guarded by g_mutex
// Records whose times a device gives (index into g_records), resolved by records().
std::vector<std::pair<std::size_t, std::unique_ptr<DeviceTimes>>> g_pending;  // by g_mutex
std::int64_t g_call_count = 0;                                                // guarded by g_mutex
thread_local OpScope* t_open = nullptr;       // innermost open scope of this thread
thread_local std::uint64_t t_ccl_scopes = 0;  // ccl_scopes_opened()

TensorInfo info(const Tensor& t, std::string_view memory) {
  return {.shape = t.shape(), .dtype = t.dtype(), .memory = std::string(memory)};
}

void push(OpRecord&& r, std::unique_ptr<DeviceTimes> times = nullptr) {
  r.timed_on_device = times != nullptr;
  const std::lock_guard lock(g_mutex);
  r.global_call_count = ++g_call_count;
  if (times) g_pending.emplace_back(g_records.size(), std::move(times));
  g_records.push_back(std::move(r));
}
}  // namespace

std::string_view op_type_name(OpType t) {
  switch (t) {
    case OpType::compute:
      return "compute";
    case OpType::ccl:
      return "ccl";
    case OpType::signpost:
      return "signpost";
  }
  return "?";
}

OpType op_type_from_name(std::string_view name) {
  for (OpType t : {OpType::compute, OpType::ccl, OpType::signpost}) {
    if (op_type_name(t) == name) return t;
  }
  fail("unknown op type '{}' (expected compute, ccl or signpost)", name);
}

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }
std::uint64_t ccl_scopes_opened() { return t_ccl_scopes; }
void set_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
void set_device_id(int id) { g_device.store(id, std::memory_order_relaxed); }
int device_id() { return g_device.load(std::memory_order_relaxed); }

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void signpost(std::string_view name) {
  if (!enabled()) return;
  OpRecord r;
  r.op_code = "signpost";
  r.op_type = OpType::signpost;
  r.device_id = device_id();
  r.attributes = std::string(name);
  r.start_ns = r.end_ns = now_ns();
  push(std::move(r));
}

std::vector<OpRecord> records() {
  const std::lock_guard lock(g_mutex);
  for (auto& [index, times] : g_pending) {
    std::tie(g_records[index].start_ns, g_records[index].end_ns) = times->resolve();
  }
  g_pending.clear();
  return g_records;
}

void clear() {
  const std::lock_guard lock(g_mutex);
  g_pending.clear();
  g_records.clear();
  g_call_count = 0;
}

Session::Session(bool enable) : was_enabled_(enabled()) {
  clear();
  set_enabled(enable);
}

Session::~Session() {
  set_enabled(was_enabled_);
  clear();
}

OpScope::OpScope(std::string_view op_code, OpType type) {
  if (type == OpType::ccl) ++t_ccl_scopes;
  // Inside a fused op's scope nothing is recorded (nor opened: deeper scopes see the fused one).
  if (!enabled() || (t_open != nullptr && t_open->fused_)) return;
  active_ = true;
  uncaught_ = std::uncaught_exceptions();
  parent_ = t_open;
  t_open = this;
  rec_.op_code = op_code;
  rec_.op_type = type;
  rec_.device_id = device_id();
  rec_.start_ns = now_ns();
}

OpScope::OpScope(std::string_view op_code, Fused) : OpScope(op_code, OpType::compute) {
  fused_ = active_;
}

OpScope::~OpScope() {
  if (!active_) return;
  rec_.end_ns = now_ns();
  t_open = parent_;
  if (std::uncaught_exceptions() > uncaught_) return;
  for (const auto& f : on_close_) f(rec_);
  // A recorded descendant makes every enclosing scope composite, not only the direct parent.
  if (parent_) parent_->child_recorded_ = true;
  if (child_recorded_) return;
  if (device_times_) device_times_->close();
  push(std::move(rec_), std::move(device_times_));
}

OpScope& OpScope::input(const Tensor& t, std::string_view memory) {
  if (active_) rec_.inputs.push_back(info(t, memory));
  return *this;
}

OpScope& OpScope::output(const Tensor& t, std::string_view memory) {
  if (active_) rec_.outputs.push_back(info(t, memory));
  return *this;
}

OpScope& OpScope::input(const TensorInfo& t) {
  if (active_) rec_.inputs.push_back(t);
  return *this;
}

OpScope& OpScope::output(const TensorInfo& t) {
  if (active_) rec_.outputs.push_back(t);
  return *this;
}

OpScope& OpScope::bytes(std::int64_t n) {
  rec_.bytes = n;
  return *this;
}

OpScope& OpScope::flops(double n) {
  rec_.flops = n;
  return *this;
}

OpScope& OpScope::device_times(std::unique_ptr<DeviceTimes> times) {
  if (active_) device_times_ = std::move(times);
  return *this;
}

OpScope& OpScope::like(const OpRecord& captured) {
  if (active_) {
    rec_.attributes = captured.attributes;
    rec_.bytes = captured.bytes;
    rec_.flops = captured.flops;
  }
  return *this;
}

void OpScope::when_innermost_closes(std::function<void(const OpRecord&)> f) {
  if (t_open != nullptr) t_open->on_close_.push_back(std::move(f));
}

void OpScope::add_attr(std::string_view key, std::string value) {
  if (!rec_.attributes.empty()) rec_.attributes += ';';
  rec_.attributes += key;
  rec_.attributes += '=';
  rec_.attributes += value;
}

}  // namespace meshtest::perf
