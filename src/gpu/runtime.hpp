// runtime: the CUDA runtime as meshtest uses it — the error check, devices, streams and events.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "src/core/error.hpp"

namespace meshtest::gpu {

/// Throws meshtest::Error "CUDA error <name>: <string> in `<expr>` (file:line)" for `err`
/// (after clearing the runtime's last error, so that a later check does not see it again).
[[noreturn]] void cuda_fail(cudaError_t err, const char* expr, const char* file, int line);

/// Number of CUDA devices this process sees (after CUDA_VISIBLE_DEVICES); 0 when there is no
/// GPU or no driver, which is never an error.
int device_count();

/// Why device_count() is 0 ("" when it is not): the runtime's error, e.g.
/// "cudaGetDeviceCount: no CUDA-capable device is detected (cudaErrorNoDevice)".
std::string no_gpu_reason();

/// Makes `ordinal` the calling thread's current device; an Error naming the ordinal and
/// device_count() when it is out of range.
void set_device(int ordinal);

/// The calling thread's current device.
int current_device();

/// Whether device `from` can read and write device `to`'s memory directly
/// (cudaDeviceCanAccessPeer); false for an ordinal out of range or from == to.
bool can_access_peer(int from, int to);

/// Queues on `stream` the device-to-device copy of `rows` rows of `width` bytes from src (rows
/// `spitch` bytes apart) to dst (rows `dpitch` apart), on the current device: one
/// cudaMemcpyAsync when the rows are contiguous on both sides, else cudaMemcpy2DAsync (a copy
/// per row where a pitch exceeds the device's limit). Nothing for no bytes. Asynchronous.
void copy_rows(std::byte* dst, std::size_t dpitch, const std::byte* src, std::size_t spitch,
               std::size_t width, std::int64_t rows, cudaStream_t stream);

/// Makes `ordinal` current for a scope and restores the previous current device at its end.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

/// The bytes to allocate for `bytes` of device data: whole 16-byte words. NCCL's copy kernels
/// load whole words of what they send, and the last word of a buffer whose size is not a
/// multiple of 4 would otherwise reach past its allocation (harmless on the hardware, an error
/// under compute-sanitizer's memcheck). `bytes` itself when rounding up would overflow.
constexpr std::size_t allocation_bytes(std::size_t bytes) {
  return bytes <= std::numeric_limits<std::size_t>::max() - 15 ? (bytes + 15) / 16 * 16 : bytes;
}

/// An owned stream on the device current at construction, created with cudaStreamNonBlocking:
/// it does not synchronize with the legacy default stream, so work on other streams is ordered
/// before it only by events or synchronization. Move-only.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  /// The device the stream belongs to.
  int device() const { return device_; }
  /// Blocks until everything queued on the stream has finished; throws its error if any.
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = -1;
};

/// An owned event with timing on. Move-only.
class Event {
 public:
  Event();
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }
  /// Records the event on `stream` (which must belong to the event's device).
  void record(cudaStream_t stream);
  /// Blocks until the work before the last record() has finished.
  void synchronize() const;
  /// Milliseconds from `start` to this event; both recorded and completed.
  float elapsed_ms_since(const Event& start) const;

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace meshtest::gpu

/// Throws meshtest::Error naming the CUDA error, the expression and file:line when `expr`
/// (a cudaError_t) is not cudaSuccess.
#define MESHTEST_CUDA_CHECK(expr)                                                \
  do {                                                                           \
    const cudaError_t meshtest_cuda_err_ = (expr);                               \
    if (meshtest_cuda_err_ != cudaSuccess)                                       \
      ::meshtest::gpu::cuda_fail(meshtest_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)
