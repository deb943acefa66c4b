// DeviceTensor: an owning, contiguous, row-major tensor whose storage is on one GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/core/dtype.hpp"
#include "src/core/shape.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::gpu {

class Stream;

namespace detail {
/// Frees the storage on the device that allocated it: a cudaMalloc'd block is kept for reuse
/// once the device has finished its work (see DeviceTensor), or cudaFree'd; a stream-ordered
/// one is freed by cudaFreeAsync on the stream it was allocated in the order of.
struct DeviceFree {
  int device = -1;
  std::shared_ptr<const Stream> stream;  ///< null: cudaMalloc'd
  std::size_t bytes = 0;                 ///< the cudaMalloc'd block's size
  std::size_t counted = 0;               ///< the block's bytes in memory_in_use
  void operator()(std::byte* p) const noexcept;
};
}  // namespace detail

/// The bytes of the DeviceTensors alive on `device` (their blocks' sizes), and the most alive at
/// once since reset_peak_memory(device) (or the start): the high-water mark of meshtest's own
/// tensors, not of the driver, the blocks kept for reuse or cuBLAS's workspaces. Thread safe.
std::size_t memory_in_use(int device);
std::size_t peak_memory(int device);
/// Sets the peak of `device` to what is in use now.
void reset_peak_memory(int device);

/// DeviceTensor's tag for storage allocated in the order of `stream` (cudaMallocAsync from the
/// device's default memory pool, which keeps freed memory for reuse) and freed in its order
/// (cudaFreeAsync): no device-wide synchronization, and a few microseconds instead of a
/// cudaMalloc's tens. The tensor keeps the stream alive. Work that another stream queued on
/// such a tensor must have finished before the tensor is destroyed (the same rule as for
/// passing it to a DeviceTensor function). Inside a gpu::Graph capture the storage is an
/// ordinary cudaMalloc (a replay needs it at a fixed address).
struct StreamOrdered {
  std::shared_ptr<const Stream> stream;
};

/// Owning, contiguous, row-major tensor in the memory of one GPU (cudaMalloc on the device
/// current at construction; never managed memory), with meshtest::Tensor's shapes, dtypes and
/// slice/split rules. Copies are deep (device to device, on the source's device); moves are
/// cheap. A tensor of no elements holds no storage and no device.
///
/// Storage: a cudaMalloc'd block outlives its tensor in a cache of its device, for the next
/// tensor of about its size (the sizes rounded up to an eighth of their power of two): the free
/// waits until the device has finished its work (cudaDeviceSynchronize), as cudaFree would, so
/// no kernel still reads a block that is handed out again, and an allocation of tens of MB
/// costs microseconds instead of a cudaMalloc's and cudaFree's hundred or more. At most 2 GiB
/// per device are kept (a larger free goes to cudaFree); when an allocation fails, the
/// device's cache is released and the allocation tried once more.
///
/// Synchronization: every member and function here is complete when it returns (its copies
/// and fills run on the legacy default stream, which is then synchronized). Work that another
/// stream queued on a tensor must be finished (synchronized) before the tensor is passed here.
/// Inside a gpu::Graph capture (graph.hpp) the device-to-device copies and fills are recorded
/// on the capture's stream instead, and from_host, to_host and bitwise_equal are an Error.
class DeviceTensor {
 public:
  /// f32[0]: no elements, no storage.
  DeviceTensor() = default;
  /// Zero-filled tensor on the current device.
  DeviceTensor(Shape shape, DType dtype);
  /// Tensor on the current device with unspecified elements (outputs written completely).
  DeviceTensor(Shape shape, DType dtype, Tensor::Uninitialized);
  /// The same, its storage allocated and freed in `order.stream`'s order (see StreamOrdered):
  /// an op's output made on the stream the op queues on.
  DeviceTensor(Shape shape, DType dtype, StreamOrdered order);
  ~DeviceTensor();

  DeviceTensor(const DeviceTensor& other);
  DeviceTensor& operator=(const DeviceTensor& other);
  DeviceTensor(DeviceTensor&& other) noexcept;
  DeviceTensor& operator=(DeviceTensor&& other) noexcept;

  /// Copy of a host tensor onto the current device.
  static DeviceTensor from_host(const Tensor& host);
  /// Copy of this tensor in host memory.
  Tensor to_host() const;

  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int rank() const { return shape_.rank(); }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t nbytes() const { return nbytes_; }
  bool empty() const { return numel() == 0; }
  /// CUDA ordinal of the device holding the storage; -1 when empty.
  int device() const { return device_; }

  /// Device pointers to the storage (null when empty).
  std::byte* bytes() { return data_.get(); }
  const std::byte* bytes() const { return data_.get(); }
  /// Typed device pointer; throws Error if T does not match the dtype.
  template <class T>
  T* data() {
    check_type(dtype_of<T>());
    return reinterpret_cast<T*>(data_.get());
  }
  template <class T>
  const T* data() const {
    check_type(dtype_of<T>());
    return reinterpret_cast<const T*>(data_.get());
  }

  /// Copy of [start, start + size) along dim, on this tensor's device.
  DeviceTensor slice(int dim, std::int64_t start, std::int64_t size) const;
  DeviceTensor slice(int dim, Range r) const { return slice(dim, r.start, r.size); }
  /// Writes `src` into [start, start + src.shape()[dim]) along dim; other dims and the dtype
  /// must match, and both tensors be on one device.
  void assign_slice(int dim, std::int64_t start, const DeviceTensor& src);
  /// Same elements, new shape (numel must match); a copy on this tensor's device.
  DeviceTensor reshape(Shape shape) const;
  /// Same dtype, shape and bytes (compared on the host, so the two may be on two devices).
  bool bitwise_equal(const DeviceTensor& other) const;

 private:
  void allocate(std::shared_ptr<const Stream> stream = nullptr);
  void check_type(DType want) const;

  Shape shape_{0};  // a default or moved-from tensor is f32[0]: empty
  DType dtype_ = DType::f32;
  std::size_t nbytes_ = 0;
  int device_ = -1;
  std::unique_ptr<std::byte, detail::DeviceFree> data_;
};

/// Concatenates along dim; all other dims, the dtype and the device must match. Needs >= 1
/// part. The result is on the parts' device.
DeviceTensor concat(const std::vector<DeviceTensor>& parts, int dim);
/// Splits along dim into p parts by the array_split rule, each on t's device.
std::vector<DeviceTensor> split(const DeviceTensor& t, int p, int dim);

/// "f32[2, 3] on cuda:0" ("f32[0, 3] (empty)" for no elements).
std::string describe(const DeviceTensor& t);

}  // namespace meshtest::gpu
