// Tensor: an owning, contiguous, row-major buffer with a Shape and a DType.
#pragma once

#include <Eigen/Core>

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "src/core/dtype.hpp"
#include "src/core/shape.hpp"

namespace meshtest {

template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Memory a tensor's bytes may come from instead of the heap (e.g. a node's shared arena that
/// the collectives read in place, dist/ccl/arena.hpp). allocate() returns `bytes` bytes aligned
/// to 64, or throws Error when it has no room.
class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;
};

/// The resource of tensors that name none: nullptr (the heap) unless a program sets one, e.g.
/// the MPI test harness under MESHTEST_CCL_ARENA (dist/ccl/arena/arena.hpp). Process-wide.
MemoryResource* default_memory_resource();
void set_default_memory_resource(MemoryResource* r);

/// The allocator of a tensor's bytes: the heap (std::allocator), or a MemoryResource. It
/// default-initializes (leaves bytes as they are) instead of zeroing. Moves carry the resource;
/// copies go to the default resource (the heap unless a program set one): a copy of a tensor
/// in an arena is an ordinary tensor.
template <class T>
struct DefaultInitAllocator {
  using value_type = T;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using propagate_on_container_copy_assignment = std::false_type;
  using is_always_equal = std::false_type;

  DefaultInitAllocator() : resource(default_memory_resource()) {}
  explicit DefaultInitAllocator(MemoryResource* r) : resource(r) {}
  template <class U>
  DefaultInitAllocator(const DefaultInitAllocator<U>& o) : resource(o.resource) {}  // NOLINT

  T* allocate(std::size_t n) {
    if (resource == nullptr) return std::allocator<T>{}.allocate(n);
    return static_cast<T*>(resource->allocate(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (resource == nullptr) return std::allocator<T>{}.deallocate(p, n);
    resource->deallocate(p, n * sizeof(T));
  }
  DefaultInitAllocator select_on_container_copy_construction() const { return {}; }
  template <class U>
  void construct(U* p) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <class U>
  bool operator==(const DefaultInitAllocator<U>& o) const {
    return resource == o.resource;
  }

  MemoryResource* resource;  ///< null: the heap
};

/// Owning, contiguous, row-major tensor. Copies are deep; moves are cheap.
class Tensor {
 public:
  /// Tag: a tensor whose elements the caller overwrites before reading (no zero fill).
  struct Uninitialized {};

  Tensor() = default;
  /// Zero-filled tensor of the given shape and dtype.
  Tensor(Shape shape, DType dtype);
  /// Tensor of the given shape and dtype with unspecified elements (outputs that an op writes
  /// completely, e.g. a collective's receive buffer).
  Tensor(Shape shape, DType dtype, Uninitialized);
  /// Zero-filled tensor whose bytes come from `where` (moves keep them there; copies, slices
  /// and ops' results are ordinary heap tensors). Throws as where.allocate() does.
  Tensor(Shape shape, DType dtype, MemoryResource& where);

  template <class T>
  static Tensor from_vector(Shape shape, const std::vector<T>& values) {
    MESHTEST_CHECK(static_cast<std::int64_t>(values.size()) == shape.numel(),
                   "Tensor::from_vector: shape {} needs {} values, got {}", shape, shape.numel(),
                   values.size());
    Tensor t(shape, dtype_of<T>());
    if (!values.empty()) std::memcpy(t.bytes(), values.data(), t.nbytes());
    return t;
  }
  /// Tensor of `shape` and `dtype` whose bytes are copied from `src` (nbytes long).
  static Tensor from_bytes(Shape shape, DType dtype, std::span<const std::byte> src);

  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int rank() const { return shape_.rank(); }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t nbytes() const { return data_.size(); }
  bool empty() const { return numel() == 0; }
  /// The resource the bytes came from, or nullptr for the heap.
  MemoryResource* resource() const { return data_.get_allocator().resource; }

  std::byte* bytes() { return data_.data(); }
  const std::byte* bytes() const { return data_.data(); }

  /// Typed pointer; throws Error if T does not match the dtype.
  template <class T>
  T* data() {
    check_type(dtype_of<T>());
    return reinterpret_cast<T*>(data_.data());
  }
  template <class T>
  const T* data() const {
    check_type(dtype_of<T>());
    return reinterpret_cast<const T*>(data_.data());
  }
  template <class T>
  std::span<T> span() {
    return {data<T>(), static_cast<std::size_t>(numel())};
  }
  template <class T>
  std::span<const T> span() const {
    return {data<T>(), static_cast<std::size_t>(numel())};
  }

  /// 2-D view: rows = product of all dims but the last, cols = the last dim.
  /// A rank-0 tensor is 1 x 1; a rank-1 tensor is 1 x n.
  template <class T>
  Eigen::Map<RowMatrix<T>> matrix() {
    return {data<T>(), rows2d(), cols2d()};
  }
  template <class T>
  Eigen::Map<const RowMatrix<T>> matrix() const {
    return {data<T>(), rows2d(), cols2d()};
  }
  /// Flat view of all elements.
  template <class T>
  Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>> vector() {
    return {data<T>(), numel()};
  }
  template <class T>
  Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>> vector() const {
    return {data<T>(), numel()};
  }

  /// Copy of [start, start + size) along dim.
  Tensor slice(int dim, std::int64_t start, std::int64_t size) const;
  Tensor slice(int dim, Range r) const { return slice(dim, r.start, r.size); }
  /// Writes `src` into [start, start + src.shape()[dim]) along dim; other dims must match.
  void assign_slice(int dim, std::int64_t start, const Tensor& src);
  /// Same elements, new shape (numel must match).
  Tensor reshape(Shape shape) const;
  /// Element-wise conversion. bf16 and f16 round to nearest even (f16 from f64 in one rounding,
  /// bf16 through f32); integers from floats truncate.
  Tensor astype(DType dtype) const;
  /// Same dtype, shape and bytes.
  bool bitwise_equal(const Tensor& other) const;
  /// Element i (flat, row-major) converted to double.
  double item(std::int64_t i) const;
  /// Fills every element with v (converted to the dtype).
  void fill(double v);

 private:
  void check_type(DType want) const;
  Eigen::Index rows2d() const;
  Eigen::Index cols2d() const;

  Shape shape_;
  DType dtype_ = DType::f32;
  std::vector<std::byte, DefaultInitAllocator<std::byte>> data_;
};

/// Concatenates along dim; all other dims and the dtype must match. Needs >= 1 part.
Tensor concat(const std::vector<Tensor>& parts, int dim);
/// Splits along dim into p parts by the array_split rule.
std::vector<Tensor> split(const Tensor& t, int p, int dim);

/// "f32[2, 3]"
std::string describe(const Tensor& t);

}  // namespace meshtest
