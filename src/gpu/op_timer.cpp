// op_timer: CUDA-event times of profiled ops, events reused from a pool per device (read early
// once finished when the pool runs dry).
#include "src/gpu/op_timer.hpp"

#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "src/gpu/capture.hpp"
#include "src/gpu/runtime.hpp"

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

}  // namespace

std::size_t timer_events_created(int device) {
  const std::lock_guard lock(g_mutex);
  const auto it = g_devices.find(device);
  return it == g_devices.end() ? 0 : it->second.created;
}

void time_on_stream(perf::OpScope& scope, cudaStream_t stream) {
  // Inside a graph capture an event would be a dependency of the capture, not a time.
  if (!scope.active() || capturing_stream() != nullptr) return;
  scope.device_times(std::make_unique<StreamTimes>(current_device(), stream));
}

}  // namespace meshtest::gpu
