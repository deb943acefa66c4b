// The per-op profiler: an RAII OpScope that every op and CCL opens, signposts, and the
// per-process list of records that dist/perf gathers across devices.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/core/tensor.hpp"
#include "src/perf/op_record.hpp"

namespace meshtest::perf {

/// Recording is off by default; an OpScope then costs one relaxed atomic load.
bool enabled();
void set_enabled(bool on);

/// The CCL scopes (OpType::ccl) this thread has opened so far, recorded or not (recording off,
/// inside a fused op): a wrapper that records work as one op of its own (a CUDA graph of GPU
/// ops: dist/testing/gpu_fused.hpp) compares two counts to see whether a collective ran inside.
std::uint64_t ccl_scopes_opened();

/// The device id stamped on new records (dist code sets it from the mesh; default 0).
void set_device_id(int id);
int device_id();

/// Steady-clock nanoseconds.
std::int64_t now_ns();

/// Records a zero-duration signpost; "start" and "stop" bound the measured region.
void signpost(std::string_view name);

/// The records of this process so far, in call order (a copy), and clear(). records() first
/// resolves the device times of scopes timed on a device (OpScope::device_times), waiting for
/// those devices.
std::vector<OpRecord> records();
void clear();

/// Restores the enabled flag and records on destruction: tests and tools use it to profile a
/// region without leaking state.   perf::Session s;  ...  auto r = perf::records();
class Session {
 public:
  explicit Session(bool enable = true);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

 private:
  bool was_enabled_;
};

/// The device-side times of one op that runs asynchronously on a device (CUDA events on a GPU
/// stream: src/gpu/op_timer.hpp), for an OpScope that must not wait for it: marked when the
/// scope opens and closes, turned into steady-clock nanoseconds only when the records are read.
class DeviceTimes {
 public:
  virtual ~DeviceTimes() = default;
  /// The scope closes: mark the op's end (queue it; never wait for the device).
  virtual void close() = 0;
  /// The op's start and end in steady-clock nanoseconds; may wait for the device. Called once,
  /// by records(), for a scope that was recorded.
  virtual std::pair<std::int64_t, std::int64_t> resolve() = 0;
};

/// RAII scope of one op call. Opened at the top of the op (start time), given the inputs,
/// outputs, attributes, bytes and flops, and recorded at destruction (end time). Only leaf
/// scopes are recorded: a scope inside which another scope was recorded (a composite op such
/// as transformer_block) is dropped, so the records are the flat op sequence a device runs.
/// Not recorded when the op throws.
///
/// A fused op (qkv_rope, sdpa_sinks, experts) is one op however it is built: opened with
/// OpScope::fused, it is recorded as a leaf, and the scopes its body opens (rope_table, permute,
/// grouped_gemm, ...) record nothing, so a report shows the fused op with its own inputs.
class OpScope {
 public:
  /// Tag of the fused constructor.
  struct Fused {};
  static constexpr Fused fused{};

  explicit OpScope(std::string_view op_code, OpType type = OpType::compute);
  /// A fused op's scope: recorded as one op; scopes opened inside it are not recorded.
  OpScope(std::string_view op_code, Fused);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

  bool active() const { return active_; }
  OpScope& input(const Tensor& t, std::string_view memory = "DEVICE");
  OpScope& output(const Tensor& t, std::string_view memory = "DEVICE");
  /// An input or output described without its tensor (a trace replay's step).
  OpScope& input(const TensorInfo& t);
  OpScope& output(const TensorInfo& t);
  /// Appends "key=value" to the attributes (';'-separated); formatted only when active.
  template <class V>
  OpScope& attr(std::string_view key, const V& value) {
    if (active_) add_attr(key, fmt::format("{}", value));
    return *this;
  }
  OpScope& bytes(std::int64_t n);
  OpScope& flops(double n);
  /// The attributes, bytes and flops of `captured` (the record of the call that a trace replay
  /// reruns), replacing this scope's.
  OpScope& like(const OpRecord& captured);
  /// Takes the op's start and end from `times` instead of the host clock (an op queued on a
  /// device): the record keeps the host times until records() resolves it. Ignored (dropped)
  /// when the scope is not active.
  OpScope& device_times(std::unique_ptr<DeviceTimes> times);

  /// While the profiler records: `f` gets the record of the innermost open scope when that
  /// scope closes without an exception (its attributes, bytes and flops are final then),
  /// whether or not it is kept as a leaf. Nothing when no scope is open. perf::Trace keeps each
  /// captured op's record this way for its replay.
  static void when_innermost_closes(std::function<void(const OpRecord&)> f);

 private:
  void add_attr(std::string_view key, std::string value);

  bool active_ = false;
  bool fused_ = false;
  int uncaught_ = 0;
  OpScope* parent_ = nullptr;
  bool child_recorded_ = false;
  OpRecord rec_;
  std::unique_ptr<DeviceTimes> device_times_;
  std::vector<std::function<void(const OpRecord&)>> on_close_;
};

}  // namespace meshtest::perf
