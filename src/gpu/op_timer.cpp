// op_timer: the device times of profiled ops from CUPTI's activity records (each timed scope
// CUPTI's external correlation while its work is queued), or from CUDA events reused from a pool
// per device (read early once finished when the pool runs dry).
#include "src/gpu/op_timer.hpp"

#include <fmt/format.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/gpu/capture.hpp"
#include "src/gpu/runtime.hpp"

#if defined(MESHTEST_HAVE_CUPTI) && __has_include(<cupti.h>)
#include <cupti.h>
#define MESHTEST_CUPTI_TIMER 1
#else
#define MESHTEST_CUPTI_TIMER 0
#endif

namespace meshtest::gpu {
namespace {

class StreamTimes;

/// A device's anchor (an event and the host time at which it had completed), its free events,
/// and its closed timers whose events are not yet read, oldest first.
struct DeviceEvents {
  cudaEvent_t anchor = nullptr;
  std::int64_t anchor_ns = 0;
  std::vector<cudaEvent_t> free;
  std::deque<StreamTimes*> in_flight;
  std::size_t created = 0;  // events made for timers (the anchor aside)
};

std::mutex g_mutex;
std::map<int, DeviceEvents> g_devices;  // guarded by g_mutex; kept until the process ends

/// At most this many finished timers are read early per event taken (bounds the host's time).
constexpr int kRecyclePerTake = 8;

DeviceEvents& device_events(int device) {
  DeviceEvents& d = g_devices[device];
  if (d.anchor == nullptr) {
    // On the legacy default stream, which meshtest's non-blocking streams never wait for: the
    // anchor completes at once whatever they have queued.
    MESHTEST_CUDA_CHECK(cudaEventCreate(&d.anchor));
    MESHTEST_CUDA_CHECK(cudaEventRecord(d.anchor, nullptr));
    MESHTEST_CUDA_CHECK(cudaEventSynchronize(d.anchor));
    d.anchor_ns = perf::now_ns();
  }
  return d;
}

std::int64_t ns_of_ms(float ms) { return std::llround(static_cast<double>(ms) * 1e6); }

/// The times of one scope: a start and an end event on its stream. Their values are read when
/// the records are (resolve), or earlier, once the end event has completed, when the device's
/// pool runs out of events (read_if_done): a long run then reuses a few events instead of
/// creating two per op.
class StreamTimes final : public perf::DeviceTimes {
 public:
  StreamTimes(int device, cudaStream_t stream);
  ~StreamTimes() override;
  StreamTimes(const StreamTimes&) = delete;
  StreamTimes& operator=(const StreamTimes&) = delete;

  void close() override;
  std::pair<std::int64_t, std::int64_t> resolve() override;

  /// With g_mutex held: reads the times and frees the events if the end event has completed
  /// (cudaEventQuery); false otherwise (not done yet, or an error left for resolve to report).
  bool read_if_done(DeviceEvents& d);

 private:
  /// With g_mutex held: the times from the completed events; the events back to the pool.
  void read(DeviceEvents& d);

  int device_;
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t end_ = nullptr;
  std::optional<std::pair<std::int64_t, std::int64_t>> times_;  // guarded by g_mutex
};

/// An event of `device` from its pool: a free one, else one of a finished timer, else a new one.
cudaEvent_t take_event(int device) {
  const std::lock_guard lock(g_mutex);
  DeviceEvents& d = device_events(device);
  for (int k = 0; d.free.empty() && k < kRecyclePerTake && !d.in_flight.empty(); ++k) {
    if (!d.in_flight.front()->read_if_done(d)) break;
    d.in_flight.pop_front();
  }
  if (!d.free.empty()) {
    cudaEvent_t e = d.free.back();
    d.free.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  MESHTEST_CUDA_CHECK(cudaEventCreate(&e));
  ++d.created;
  return e;
}

StreamTimes::StreamTimes(int device, cudaStream_t stream)
    : device_(device), stream_(stream), start_(take_event(device)), end_(take_event(device)) {
  const cudaError_t err = cudaEventRecord(start_, stream_);
  if (err != cudaSuccess) {
    {
      const std::lock_guard lock(g_mutex);
      DeviceEvents& d = g_devices.at(device_);
      d.free.push_back(start_);
      d.free.push_back(end_);
    }
    start_ = end_ = nullptr;
    cuda_fail(err, "cudaEventRecord(start_, stream_)", __FILE__, __LINE__);
  }
}

StreamTimes::~StreamTimes() {
  const std::lock_guard lock(g_mutex);
  DeviceEvents& d = g_devices.at(device_);
  std::erase(d.in_flight, this);
  if (start_ != nullptr) d.free.push_back(start_);
  if (end_ != nullptr) d.free.push_back(end_);
}

void StreamTimes::close() {
  MESHTEST_CUDA_CHECK(cudaEventRecord(end_, stream_));
  const std::lock_guard lock(g_mutex);
  g_devices.at(device_).in_flight.push_back(this);
}

bool StreamTimes::read_if_done(DeviceEvents& d) {
  const cudaError_t status = cudaEventQuery(end_);
  if (status != cudaSuccess) {
    if (status != cudaErrorNotReady) (void)cudaGetLastError();  // resolve reports it
    return false;
  }
  read(d);
  return true;
}

void StreamTimes::read(DeviceEvents& d) {
  float since_anchor = 0, duration = 0;
  MESHTEST_CUDA_CHECK(cudaEventElapsedTime(&since_anchor, d.anchor, start_));
  MESHTEST_CUDA_CHECK(cudaEventElapsedTime(&duration, start_, end_));
  // The duration from its own pair of events: float milliseconds counted from the anchor lose
  // precision as the run goes on (about 60 ns per second since the anchor).
  const std::int64_t start = d.anchor_ns + ns_of_ms(since_anchor);
  times_.emplace(start, start + ns_of_ms(duration));
  d.free.push_back(start_);
  d.free.push_back(end_);
  start_ = end_ = nullptr;
}

std::pair<std::int64_t, std::int64_t> StreamTimes::resolve() {
  const DeviceGuard on(device_);
  cudaEvent_t end = nullptr;
  {
    const std::lock_guard lock(g_mutex);
    if (times_) return *times_;
    end = end_;
  }
  MESHTEST_CUDA_CHECK(cudaEventSynchronize(end));
  const std::lock_guard lock(g_mutex);
  if (!times_) {
    DeviceEvents& d = g_devices.at(device_);
    std::erase(d.in_flight, this);
    read(d);
  }
  return *times_;
}

// ------------------------------------------------------------------------------------ CUPTI

#if MESHTEST_CUPTI_TIMER

/// The earliest start and latest end of a scope's records (CUPTI's clock).
struct Span {
  std::int64_t start = LLONG_MAX, end = LLONG_MIN;
  void add(std::uint64_t s, std::uint64_t e) {
    start = std::min(start, static_cast<std::int64_t>(s));
    end = std::max(end, static_cast<std::int64_t>(e));
  }
};

/// CUPTI's state: whether it started (or why not), its clock's offset from the host's steady
/// clock, and the records read so far, by scope: a record's correlation id leads to the scope
/// that was CUPTI's external correlation (kind CUSTOM0) when its work was queued.
struct Cupti {
  std::mutex mutex;
  bool tried = false, on = false;
  std::string problem = "not started";
  std::int64_t offset_ns = 0;  // host steady clock - CUPTI's
  std::uint64_t next_id = 1;
  std::uint64_t closed = 0, flushed_upto = 0;  // scopes closed; of those, read by a flush
  std::unordered_map<std::uint32_t, std::uint64_t> scope_of;  // correlation id -> scope
  std::unordered_map<std::uint64_t, std::vector<std::uint32_t>> correlations;  // scope -> ids
  std::unordered_map<std::uint32_t, Span> pending;  // records read before their correlation
  std::unordered_map<std::uint64_t, Span> spans;    // scope -> its records' span

  /// With mutex held.
  void add(std::uint32_t correlation, std::uint64_t start, std::uint64_t end) {
    const auto it = scope_of.find(correlation);
    if (it != scope_of.end()) {
      spans[it->second].add(start, end);
    } else {
      pending[correlation].add(start, end);
    }
  }
  void correlate(std::uint32_t correlation, std::uint64_t scope) {
    scope_of[correlation] = scope;
    correlations[scope].push_back(correlation);
    const auto it = pending.find(correlation);
    if (it != pending.end()) {
      Span& s = spans[scope];
      s.start = std::min(s.start, it->second.start);
      s.end = std::max(s.end, it->second.end);
      pending.erase(it);
    }
  }
  void forget(std::uint64_t scope) {
    const auto it = correlations.find(scope);
    if (it != correlations.end()) {
      for (const std::uint32_t c : it->second) scope_of.erase(c);
      correlations.erase(it);
    }
    spans.erase(scope);
  }
};

Cupti& cupti() {
  static auto* c = new Cupti;  // never destroyed: CUPTI may call back until the process ends
  return *c;
}

constexpr std::size_t kCuptiBuffer = std::size_t{1} << 20;

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kCuptiBuffer));
  *size = *buffer == nullptr ? 0 : kCuptiBuffer;
  *max = 0;
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t,
                               std::size_t valid) {
  Cupti& c = cupti();
  {
    const std::lock_guard lock(c.mutex);
    CUpti_Activity* r = nullptr;
    while (valid > 0 && cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
      switch (r->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
          c.add(k->correlationId, k->start, k->end);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
          c.add(m->correlationId, m->start, m->end);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
          c.add(m->correlationId, m->start, m->end);
          break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
          const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(r);
          if (e->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) {
            c.correlate(e->correlationId, e->externalId);
          }
          break;
        }
        default:
          break;
      }
    }
  }
  std::free(buffer);
}

/// The records read, and the API records that CUPTI needs to emit external correlations (one per
/// runtime or driver call made while a scope is pushed; cuBLAS launches through the driver).
constexpr CUpti_ActivityKind kCuptiKinds[] = {CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
                                              CUPTI_ACTIVITY_KIND_RUNTIME,
                                              CUPTI_ACTIVITY_KIND_DRIVER,
                                              CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                              CUPTI_ACTIVITY_KIND_MEMCPY,
                                              CUPTI_ACTIVITY_KIND_MEMSET};

std::string cupti_error(const char* call, CUptiResult r) {
  const char* text = nullptr;
  (void)cuptiGetResultString(r, &text);
  return fmt::format("{} failed: {}", call, text != nullptr ? text : "unknown CUPTI error");
}

/// With c.mutex held: CUPTI's records on (started the first time), or why not.
void cupti_on(Cupti& c) {
  if (c.on) return;
  if (!c.tried) {
    c.tried = true;
    if (const CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
        r != CUPTI_SUCCESS) {
      c.problem = cupti_error("cuptiActivityRegisterCallbacks", r);
      return;
    }
  } else if (c.problem != "turned off") {
    return;  // it failed to start before
  }
  for (std::size_t k = 0; k < std::size(kCuptiKinds); ++k) {
    if (const CUptiResult r = cuptiActivityEnable(kCuptiKinds[k]); r != CUPTI_SUCCESS) {
      for (std::size_t j = 0; j < k; ++j) (void)cuptiActivityDisable(kCuptiKinds[j]);
      c.problem = cupti_error("cuptiActivityEnable", r);
      return;
    }
  }
  std::uint64_t now = 0;
  (void)cuptiGetTimestamp(&now);
  c.offset_ns = perf::now_ns() - static_cast<std::int64_t>(now);
  c.on = true;
  c.problem.clear();
}

/// The device done with every scope closed so far, and CUPTI's records of them read.
void cupti_flush(int device) {
  Cupti& c = cupti();
  std::uint64_t upto = 0;
  {
    const std::lock_guard lock(c.mutex);
    upto = c.closed;
  }
  {
    const DeviceGuard on(device);
    MESHTEST_CUDA_CHECK(cudaDeviceSynchronize());
  }
  (void)cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);  // buffer_completed locks
  const std::lock_guard lock(c.mutex);
  c.flushed_upto = std::max(c.flushed_upto, upto);
  // What is still unmatched was queued outside every timed scope.
  c.pending.clear();
}

/// The times of one scope from CUPTI's records of the work queued while it was CUPTI's external
/// correlation; the host's times when it queued none.
class CuptiTimes final : public perf::DeviceTimes {
 public:
  explicit CuptiTimes(int device) : device_(device), host_start_(perf::now_ns()) {
    Cupti& c = cupti();
    {
      const std::lock_guard lock(c.mutex);
      id_ = c.next_id++;
    }
    if (const CUptiResult r =
            cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id_);
        r != CUPTI_SUCCESS) {
      fail("time_on_stream: {}", cupti_error("cuptiActivityPushExternalCorrelationId", r));
    }
  }
  ~CuptiTimes() override {
    if (!closed_) {
      std::uint64_t last = 0;
      (void)cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
    }
    Cupti& c = cupti();
    const std::lock_guard lock(c.mutex);
    c.forget(id_);
  }
  CuptiTimes(const CuptiTimes&) = delete;
  CuptiTimes& operator=(const CuptiTimes&) = delete;

  void close() override {
    std::uint64_t last = 0;
    (void)cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
    closed_ = true;
    Cupti& c = cupti();
    const std::lock_guard lock(c.mutex);
    close_seq_ = ++c.closed;
  }

  std::pair<std::int64_t, std::int64_t> resolve() override {
    Cupti& c = cupti();
    bool read = false;
    {
      const std::lock_guard lock(c.mutex);
      read = c.flushed_upto >= close_seq_;
    }
    if (!read) cupti_flush(device_);
    const std::lock_guard lock(c.mutex);
    const auto it = c.spans.find(id_);
    if (it == c.spans.end() || it->second.start > it->second.end) {
      return {host_start_, host_start_};  // no work queued
    }
    return {it->second.start + c.offset_ns, it->second.end + c.offset_ns};
  }

 private:
  int device_;
  std::int64_t host_start_;
  std::uint64_t id_ = 0;
  std::uint64_t close_seq_ = 0;
  bool closed_ = false;
};

#endif  // MESHTEST_CUPTI_TIMER

std::mutex g_timer_mutex;
std::optional<GpuTimer> g_timer_set;  // guarded by g_timer_mutex: set_gpu_timer's choice

/// MESHTEST_GPU_TIMER's choice, or set_gpu_timer's.
GpuTimer asked_timer() {
  {
    const std::lock_guard lock(g_timer_mutex);
    if (g_timer_set) return *g_timer_set;
  }
  const char* env = std::getenv("MESHTEST_GPU_TIMER");
  const std::string v = env == nullptr ? "" : env;
  MESHTEST_CHECK(v.empty() || v == "cupti" || v == "events",
                 "MESHTEST_GPU_TIMER is '{}': cupti or events expected", v);
  return v == "events" ? GpuTimer::events : GpuTimer::cupti;
}

/// Whether CUPTI times the scopes (started on the first call that asks for it).
bool cupti_timing() {
  if (asked_timer() != GpuTimer::cupti) return false;
#if MESHTEST_CUPTI_TIMER
  Cupti& c = cupti();
  const std::lock_guard lock(c.mutex);
  cupti_on(c);
  return c.on;
#else
  return false;
#endif
}

}  // namespace

GpuTimer gpu_timer() { return cupti_timing() ? GpuTimer::cupti : GpuTimer::events; }

std::string cupti_problem() {
  if (asked_timer() != GpuTimer::cupti) return "the events timer was asked for";
#if MESHTEST_CUPTI_TIMER
  (void)cupti_timing();
  Cupti& c = cupti();
  const std::lock_guard lock(c.mutex);
  return c.problem;
#else
  return "meshtest was built without CUPTI";
#endif
}

void set_gpu_timer(std::optional<GpuTimer> timer) {
  {
    const std::lock_guard lock(g_timer_mutex);
    g_timer_set = timer;
  }
#if MESHTEST_CUPTI_TIMER
  if (timer == GpuTimer::events) {  // CUPTI's records off: launches stop paying for them
    Cupti& c = cupti();
    const std::lock_guard lock(c.mutex);
    if (c.on) {
      for (const CUpti_ActivityKind k : kCuptiKinds) (void)cuptiActivityDisable(k);
      c.on = false;
      c.problem = "turned off";
    }
  }
#endif
}

std::size_t timer_events_created(int device) {
  const std::lock_guard lock(g_mutex);
  const auto it = g_devices.find(device);
  return it == g_devices.end() ? 0 : it->second.created;
}

void time_on_stream(perf::OpScope& scope, cudaStream_t stream) {
  // Inside a graph capture an event would be a dependency of the capture, not a time.
  if (!scope.active() || capturing_stream() != nullptr) return;
#if MESHTEST_CUPTI_TIMER
  if (cupti_timing()) {
    scope.device_times(std::make_unique<CuptiTimes>(current_device()));
    return;
  }
#endif
  scope.device_times(std::make_unique<StreamTimes>(current_device(), stream));
}

}  // namespace meshtest::gpu
