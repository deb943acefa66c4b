// DeviceTensor storage (cudaMalloc, with a cache of freed blocks), host copies, slicing, concat and
// split on one GPU.
#include "src/gpu/device_tensor.hpp"

#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "src/core/slice_bytes.hpp"
#include "src/gpu/capture.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::gpu {
namespace {

// Every copy and fill runs on the legacy default stream and is waited for, so that a
// DeviceTensor operation is complete when it returns (see the header); inside a gpu::Graph
// capture it is recorded on the capture's stream instead, in order with the captured ops.
cudaStream_t copy_stream() { return stream_for(cudaStreamLegacy); }
void finish() {
  if (capturing_stream() == nullptr) MESHTEST_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

/// A copy between host and device cannot be replayed (the host side is not the graph's).
void check_not_capturing(const char* what) {
  MESHTEST_CHECK(capturing_stream() == nullptr,
                 "DeviceTensor::{} inside a gpu::Graph capture: a copy between host and device "
                 "cannot be replayed (make the copy before the capture or after a replay)",
                 what);
}

/// copy_rows (runtime.hpp) on copy_stream(); complete on return. No bytes touch no device.
void copy_rows_now(std::byte* dst, std::size_t dpitch, const std::byte* src, std::size_t spitch,
                   std::size_t width, std::int64_t rows) {
  if (width == 0 || rows <= 0) return;
  copy_rows(dst, dpitch, src, spitch, width, rows, copy_stream());
  finish();
}

/// The current device made `device` for a scope; no change for a tensor without storage (-1).
class OnDevice {
 public:
  explicit OnDevice(int device) {
    if (device >= 0) guard_.emplace(device);
  }

 private:
  std::optional<DeviceGuard> guard_;
};

/// Makes the current device's default memory pool keep freed memory (release threshold: all),
/// once per device: stream-ordered allocations then reuse it instead of asking the driver.
void keep_pool_memory(int device) {
  static std::mutex mutex;
  static std::set<int> done;
  const std::lock_guard lock(mutex);
  if (!done.insert(device).second) return;
  cudaMemPool_t pool = nullptr;
  MESHTEST_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  std::uint64_t all = std::numeric_limits<std::uint64_t>::max();
  MESHTEST_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &all));
}

/// cudaMalloc'd blocks whose tensors were freed, kept per device and size for the next tensor
/// of that size (see DeviceTensor).
class StorageCache {
 public:
  static constexpr std::size_t kMaxBytes = std::size_t{2} << 30;  // kept per device

  /// A kept block of `bytes` (a cached_size) on `device`, or null.
  void* take(int device, std::size_t bytes) {
    const std::lock_guard lock(mutex_);
    const auto it = kept_.find({device, bytes});
    if (it == kept_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    held_[device] -= bytes;
    return p;
  }
  /// Keeps p (`bytes`, its device finished with it) if the device's cache has room.
  bool keep(int device, void* p, std::size_t bytes) {
    const std::lock_guard lock(mutex_);
    std::size_t& held = held_[device];
    if (held + bytes > kMaxBytes) return false;
    kept_[{device, bytes}].push_back(p);
    held += bytes;
    return true;
  }
  /// cudaFree's every kept block of `device`, the current device.
  void release(int device) {
    const std::lock_guard lock(mutex_);
    for (auto it = kept_.begin(); it != kept_.end();) {
      if (it->first.first != device) {
        ++it;
        continue;
      }
      for (void* p : it->second) (void)cudaFree(p);
      it = kept_.erase(it);
    }
    held_[device] = 0;
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<int, std::size_t>, std::vector<void*>> kept_;
  std::map<int, std::size_t> held_;
};

/// Live and peak bytes of the DeviceTensors per device (memory_in_use, peak_memory).
class MemoryCounter {
 public:
  void add(int device, std::size_t bytes) {
    const std::lock_guard lock(mutex_);
    auto& [live, peak] = bytes_[device];
    live += bytes;
    peak = std::max(peak, live);
  }
  void remove(int device, std::size_t bytes) {
    const std::lock_guard lock(mutex_);
    auto& live = bytes_[device].first;
    live -= std::min(live, bytes);
  }
  std::pair<std::size_t, std::size_t> get(int device) {
    const std::lock_guard lock(mutex_);
    return bytes_[device];
  }
  void reset(int device) {
    const std::lock_guard lock(mutex_);
    auto& [live, peak] = bytes_[device];
    peak = live;
  }

 private:
  std::mutex mutex_;
  std::map<int, std::pair<std::size_t, std::size_t>> bytes_;
};

MemoryCounter& memory_counter() {
  static MemoryCounter* const counter = new MemoryCounter;  // never destroyed, as the cache
  return *counter;
}

/// The process's cache, never destroyed: the blocks it keeps at exit go with the process.
StorageCache& storage_cache() {
  static StorageCache* const cache = new StorageCache;
  return *cache;
}

/// The size of the cudaMalloc'd block for `bytes`: allocation_bytes rounded up to a multiple of
/// an eighth of its power of two (at least 512 B), so tensors of nearby sizes share blocks.
std::size_t cached_size(std::size_t bytes) {
  const std::size_t n = allocation_bytes(bytes);
  if (n <= 4096) return (n + 511) / 512 * 512;
  std::size_t power = 1;
  while (power <= n / 2) power *= 2;
  const std::size_t granule = power / 8;
  return n <= std::numeric_limits<std::size_t>::max() - granule
             ? (n + granule - 1) / granule * granule
             : n;
}

}  // namespace

std::size_t memory_in_use(int device) { return memory_counter().get(device).first; }
std::size_t peak_memory(int device) { return memory_counter().get(device).second; }
void reset_peak_memory(int device) { memory_counter().reset(device); }

void detail::DeviceFree::operator()(std::byte* p) const noexcept {
  memory_counter().remove(device, counted);
  if (keep_if_capturing(p, device, stream)) return;  // a replay may still use it
  int previous = -1;
  const bool switch_device = cudaGetDevice(&previous) == cudaSuccess && previous != device;
  if (switch_device) (void)cudaSetDevice(device);
  if (stream != nullptr) {
    (void)cudaFreeAsync(p, stream->get());
  } else if (bytes == 0 || cudaDeviceSynchronize() != cudaSuccess ||
             !storage_cache().keep(device, p, bytes)) {
    (void)cudaFree(p);
  }
  if (switch_device) (void)cudaSetDevice(previous);
}

DeviceTensor::DeviceTensor(Shape shape, DType dtype, Tensor::Uninitialized)
    : shape_(shape), dtype_(dtype) {
  allocate();
}

DeviceTensor::DeviceTensor(Shape shape, DType dtype, StreamOrdered order)
    : shape_(shape), dtype_(dtype) {
  MESHTEST_CHECK(order.stream != nullptr, "DeviceTensor {}{}: StreamOrdered without a stream",
                 dtype_, shape_);
  allocate(capturing_stream() == nullptr ? std::move(order.stream) : nullptr);
}

DeviceTensor::DeviceTensor(Shape shape, DType dtype)
    : DeviceTensor(shape, dtype, Tensor::Uninitialized{}) {
  if (nbytes_ == 0) return;
  MESHTEST_CUDA_CHECK(cudaMemsetAsync(bytes(), 0, nbytes_, copy_stream()));
  finish();
}

DeviceTensor::~DeviceTensor() = default;

void DeviceTensor::allocate(std::shared_ptr<const Stream> stream) {
  const std::int64_t n = shape_.numel();
  const std::size_t size = dtype_size(dtype_);
  MESHTEST_CHECK(
      n >= 0 && static_cast<std::uint64_t>(n) <= std::numeric_limits<std::size_t>::max() / size,
      "DeviceTensor {}{}: {} elements of {} bytes do not fit in memory", dtype_, shape_, n, size);
  nbytes_ = static_cast<std::size_t>(n) * size;
  if (nbytes_ == 0) return;
  device_ = current_device();
  void* p = nullptr;
  if (stream != nullptr) keep_pool_memory(device_);
  const std::size_t block = stream != nullptr ? allocation_bytes(nbytes_) : cached_size(nbytes_);
  if (stream == nullptr) p = storage_cache().take(device_, block);
  const auto allocate_block = [&] {
    return stream != nullptr ? cudaMallocAsync(&p, block, stream->get()) : cudaMalloc(&p, block);
  };
  cudaError_t err = p != nullptr ? cudaSuccess : allocate_block();
  if (err != cudaSuccess) {  // the kept blocks may be what is missing: once more without them
    (void)cudaGetLastError();
    storage_cache().release(device_);
    err = allocate_block();
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    std::size_t free = 0, total = 0;
    const bool known = cudaMemGetInfo(&free, &total) == cudaSuccess;
    (void)cudaGetLastError();
    fail("cudaMalloc of {} bytes for {}{} on cuda:{} failed: {} ({}); the device has {}", nbytes_,
         dtype_, shape_, device_, cudaGetErrorString(err), cudaGetErrorName(err),
         known ? fmt::format("{} of {} bytes free", free, total) : "unknown free memory");
  }
  const std::size_t kept = stream != nullptr ? 0 : block;
  memory_counter().add(device_, block);
  data_ = std::unique_ptr<std::byte, detail::DeviceFree>(
      static_cast<std::byte*>(p), detail::DeviceFree{device_, std::move(stream), kept, block});
}

DeviceTensor::DeviceTensor(const DeviceTensor& other) : shape_(other.shape_), dtype_(other.dtype_) {
  const OnDevice on_device(other.device_);
  allocate();
  copy_rows_now(bytes(), nbytes_, other.bytes(), nbytes_, nbytes_, 1);
}

DeviceTensor& DeviceTensor::operator=(const DeviceTensor& other) {
  if (this != &other) *this = DeviceTensor(other);
  return *this;
}

DeviceTensor::DeviceTensor(DeviceTensor&& other) noexcept
    : shape_(std::exchange(other.shape_, Shape{0})),
      dtype_(std::exchange(other.dtype_, DType::f32)),
      nbytes_(std::exchange(other.nbytes_, 0)),
      device_(std::exchange(other.device_, -1)),
      data_(std::move(other.data_)) {}

DeviceTensor& DeviceTensor::operator=(DeviceTensor&& other) noexcept {
  if (this != &other) {
    shape_ = std::exchange(other.shape_, Shape{0});
    dtype_ = std::exchange(other.dtype_, DType::f32);
    nbytes_ = std::exchange(other.nbytes_, 0);
    device_ = std::exchange(other.device_, -1);
    data_ = std::move(other.data_);
  }
  return *this;
}

DeviceTensor DeviceTensor::from_host(const Tensor& host) {
  check_not_capturing("from_host");
  DeviceTensor out(host.shape(), host.dtype(), Tensor::Uninitialized{});
  if (out.nbytes_ == 0) return out;
  MESHTEST_CUDA_CHECK(cudaMemcpyAsync(out.bytes(), host.bytes(), out.nbytes_,
                                      cudaMemcpyHostToDevice, cudaStreamLegacy));
  finish();
  return out;
}

Tensor DeviceTensor::to_host() const {
  check_not_capturing("to_host");
  Tensor out(shape_, dtype_, Tensor::Uninitialized{});
  if (nbytes_ == 0) return out;
  const OnDevice on_device(device_);
  MESHTEST_CUDA_CHECK(
      cudaMemcpyAsync(out.bytes(), bytes(), nbytes_, cudaMemcpyDeviceToHost, cudaStreamLegacy));
  finish();
  return out;
}

void DeviceTensor::check_type(DType want) const {
  MESHTEST_CHECK(want == dtype_, "DeviceTensor {}: accessed as {}, but its dtype is {}",
                 describe(*this), want, dtype_);
}

DeviceTensor DeviceTensor::slice(int dim, std::int64_t start, std::int64_t size) const {
  const SliceBytes l =
      checked_slice(shape_, dtype_, dim, start, size, [&] { return describe(*this); });
  const OnDevice on_device(device_);
  DeviceTensor out(shape_.with(l.dim, size), dtype_, Tensor::Uninitialized{});
  if (out.nbytes_ == 0) return out;
  copy_rows_now(out.bytes(), l.run, bytes() + l.offset, l.stride, l.run, l.rows);
  return out;
}

void DeviceTensor::assign_slice(int dim, std::int64_t start, const DeviceTensor& src) {
  const SliceBytes l = checked_assign(shape_, dtype_, src.shape_, src.dtype_, dim, start);
  MESHTEST_CHECK(src.device_ < 0 || device_ < 0 || src.device_ == device_,
                 "assign_slice: tensors on two devices ({} into {})", describe(src),
                 describe(*this));
  if (src.nbytes_ == 0) return;
  const OnDevice on_device(device_);
  copy_rows_now(bytes() + l.offset, l.stride, src.bytes(), l.run, l.run, l.rows);
}

DeviceTensor DeviceTensor::reshape(Shape shape) const {
  MESHTEST_CHECK(shape.numel() == numel(), "reshape: {} has {} elements, {} has {}", shape_,
                 numel(), shape, shape.numel());
  DeviceTensor out = *this;
  out.shape_ = shape;
  return out;
}

bool DeviceTensor::bitwise_equal(const DeviceTensor& other) const {
  return dtype_ == other.dtype_ && shape_ == other.shape_ &&
         to_host().bitwise_equal(other.to_host());
}

DeviceTensor concat(const std::vector<DeviceTensor>& parts, int dim) {
  const auto [d, total] = checked_concat(parts, dim);
  int device = -1;
  for (const DeviceTensor& p : parts) {
    MESHTEST_CHECK(device < 0 || p.device() < 0 || p.device() == device,
                   "concat: parts on two devices (cuda:{} and {})", device, describe(p));
    if (device < 0) device = p.device();
  }
  const OnDevice on_device(device);
  DeviceTensor out(parts.front().shape().with(d, total), parts.front().dtype(),
                   Tensor::Uninitialized{});
  write_parts(out, parts, d);
  return out;
}

std::vector<DeviceTensor> split(const DeviceTensor& t, int p, int dim) {
  return split_parts(t, p, dim);
}

std::string describe(const DeviceTensor& t) {
  if (t.device() < 0) return fmt::format("{}{} (empty)", t.dtype(), t.shape());
  return fmt::format("{}{} on cuda:{}", t.dtype(), t.shape(), t.device());
}

}  // namespace meshtest::gpu
