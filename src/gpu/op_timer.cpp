// op_timer: CUDA-event times of profiled ops, events reused from a pool per device.
#include "src/gpu/op_timer.hpp"

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "src/gpu/runtime.hpp"

namespace meshtest::gpu {
namespace {

/// A device's anchor (an event and the host time at which it had completed) and its free events.
struct DeviceEvents {
  cudaEvent_t anchor = nullptr;
  std::int64_t anchor_ns = 0;
  std::vector<cudaEvent_t> free;
};

std::mutex g_mutex;
std::map<int, DeviceEvents> g_devices;  // guarded by g_mutex; kept until the process ends

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

cudaEvent_t take_event(int device) {
  const std::lock_guard lock(g_mutex);
  DeviceEvents& d = device_events(device);
  if (!d.free.empty()) {
    cudaEvent_t e = d.free.back();
    d.free.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  MESHTEST_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void give_event(int device, cudaEvent_t e) {
  const std::lock_guard lock(g_mutex);
  g_devices[device].free.push_back(e);
}

std::int64_t ns_of_ms(float ms) { return std::llround(static_cast<double>(ms) * 1e6); }

class StreamTimes final : public perf::DeviceTimes {
 public:
  StreamTimes(int device, cudaStream_t stream)
      : device_(device), stream_(stream), start_(take_event(device)), end_(take_event(device)) {
    const cudaError_t err = cudaEventRecord(start_, stream_);
    if (err != cudaSuccess) {
      give_event(device_, start_);
      give_event(device_, end_);
      cuda_fail(err, "cudaEventRecord(start_, stream_)", __FILE__, __LINE__);
    }
  }
  ~StreamTimes() override {
    give_event(device_, start_);
    give_event(device_, end_);
  }
  StreamTimes(const StreamTimes&) = delete;
  StreamTimes& operator=(const StreamTimes&) = delete;

  void close() override { MESHTEST_CUDA_CHECK(cudaEventRecord(end_, stream_)); }

  std::pair<std::int64_t, std::int64_t> resolve() override {
    const DeviceGuard on(device_);
    MESHTEST_CUDA_CHECK(cudaEventSynchronize(end_));
    cudaEvent_t anchor = nullptr;
    std::int64_t anchor_ns = 0;
    {
      const std::lock_guard lock(g_mutex);
      const DeviceEvents& d = g_devices.at(device_);
      anchor = d.anchor;
      anchor_ns = d.anchor_ns;
    }
    float since_anchor = 0, duration = 0;
    MESHTEST_CUDA_CHECK(cudaEventElapsedTime(&since_anchor, anchor, start_));
    MESHTEST_CUDA_CHECK(cudaEventElapsedTime(&duration, start_, end_));
    // The duration from its own pair of events: float milliseconds counted from the anchor lose
    // precision as the run goes on (about 60 ns per second since the anchor).
    const std::int64_t start = anchor_ns + ns_of_ms(since_anchor);
    return {start, start + ns_of_ms(duration)};
  }

 private:
  int device_;
  cudaStream_t stream_;
  cudaEvent_t start_;
  cudaEvent_t end_;
};

}  // namespace

void time_on_stream(perf::OpScope& scope, cudaStream_t stream) {
  if (!scope.active()) return;
  scope.device_times(std::make_unique<StreamTimes>(current_device(), stream));
}

}  // namespace meshtest::gpu
