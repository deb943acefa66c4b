// runtime: the CUDA error check, device selection, and the Stream and Event owners.
#include "src/gpu/runtime.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <utility>

namespace meshtest::gpu {

void cuda_fail(cudaError_t err, const char* expr, const char* file, int line) {
  (void)cudaGetLastError();  // a non-sticky error must not resurface at the next check
  fail("CUDA error {}: {} in `{}` ({}:{})", cudaGetErrorName(err), cudaGetErrorString(err), expr,
       file, line);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string no_gpu_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fmt::format("cudaGetDeviceCount: {} ({})", cudaGetErrorString(err),
                       cudaGetErrorName(err));
  }
  if (n > 0) return "";
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return fmt::format("cudaGetDeviceCount: no device visible (CUDA_VISIBLE_DEVICES={})",
                     visible != nullptr ? visible : "unset");
}

void copy_rows(std::byte* dst, std::size_t dpitch, const std::byte* src, std::size_t spitch,
               std::size_t width, std::int64_t rows, cudaStream_t stream) {
  if (width == 0 || rows <= 0) return;
  const auto n = static_cast<std::size_t>(rows);
  if (n == 1 || (dpitch == width && spitch == width)) {
    MESHTEST_CUDA_CHECK(cudaMemcpyAsync(dst, src, width * n, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  int max_pitch = 0;
  MESHTEST_CUDA_CHECK(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, current_device()));
  if (dpitch <= static_cast<std::size_t>(max_pitch) &&
      spitch <= static_cast<std::size_t>(max_pitch)) {
    MESHTEST_CUDA_CHECK(
        cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, n, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  for (std::size_t r = 0; r < n; ++r) {  // rows too far apart for a 2-D copy: few, each large
    MESHTEST_CUDA_CHECK(cudaMemcpyAsync(dst + r * dpitch, src + r * spitch, width,
                                        cudaMemcpyDeviceToDevice, stream));
  }
}

void set_device(int ordinal) {
  const int n = device_count();
  MESHTEST_CHECK(ordinal >= 0 && ordinal < n,
                 "set_device: no CUDA device {}: this process sees {} device{}{}", ordinal, n,
                 n == 1 ? "" : "s", n == 0 ? fmt::format(" ({})", no_gpu_reason()) : "");
  MESHTEST_CUDA_CHECK(cudaSetDevice(ordinal));
}

int current_device() {
  int d = 0;
  MESHTEST_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

bool can_access_peer(int from, int to) {
  const int n = device_count();
  if (from == to || from < 0 || to < 0 || from >= n || to >= n) return false;
  int can = 0;
  MESHTEST_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, from, to));
  return can != 0;
}

DeviceGuard::DeviceGuard(int ordinal) : previous_(current_device()) {
  if (ordinal != previous_) {
    set_device(ordinal);
    switched_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (switched_) (void)cudaSetDevice(previous_);
}

Stream::Stream() : device_(current_device()) {
  MESHTEST_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

Stream::~Stream() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(std::exchange(other.device_, -1)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

void Stream::synchronize() const { MESHTEST_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

Event::Event() { MESHTEST_CUDA_CHECK(cudaEventCreate(&event_)); }

Event::~Event() {
  if (event_ != nullptr) (void)cudaEventDestroy(event_);
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::record(cudaStream_t stream) { MESHTEST_CUDA_CHECK(cudaEventRecord(event_, stream)); }

void Event::synchronize() const { MESHTEST_CUDA_CHECK(cudaEventSynchronize(event_)); }

float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  MESHTEST_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

}  // namespace meshtest::gpu
