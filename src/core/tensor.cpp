// Tensor storage, slicing, concat and the array_split split.
#include "src/core/tensor.hpp"

#include <atomic>

#include <fmt/format.h>

#include "src/core/slice_bytes.hpp"

namespace meshtest {

DType dtype_from_name(std::string_view name) {
  for (DType t : kAllDTypes) {
    if (dtype_name(t) == name) return t;
  }
  fail("unknown dtype '{}' (expected one of f32, f64, bf16, f16, i32, i64, u8)", name);
}

namespace {
std::atomic<MemoryResource*>& default_resource() {
  static std::atomic<MemoryResource*> r{nullptr};
  return r;
}
}  // namespace

MemoryResource* default_memory_resource() {
  return default_resource().load(std::memory_order_relaxed);
}

void set_default_memory_resource(MemoryResource* r) {
  default_resource().store(r, std::memory_order_relaxed);
}

Tensor::Tensor(Shape shape, DType dtype)
    : shape_(shape),
      dtype_(dtype),
      data_(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype), std::byte{0}) {}

Tensor::Tensor(Shape shape, DType dtype, Uninitialized) : shape_(shape), dtype_(dtype) {
  data_.resize(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype));
}

Tensor::Tensor(Shape shape, DType dtype, MemoryResource& where)
    : shape_(shape),
      dtype_(dtype),
      data_(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype), std::byte{0},
            DefaultInitAllocator<std::byte>(&where)) {}

Tensor Tensor::from_bytes(Shape shape, DType dtype, std::span<const std::byte> src) {
  Tensor t(shape, dtype);
  MESHTEST_CHECK(src.size() == t.nbytes(), "Tensor::from_bytes: {}{} needs {} bytes, got {}", dtype,
                 shape, t.nbytes(), src.size());
  if (!src.empty()) std::memcpy(t.bytes(), src.data(), src.size());
  return t;
}

void Tensor::check_type(DType want) const {
  MESHTEST_CHECK(want == dtype_, "Tensor {}: accessed as {}, but its dtype is {}", describe(*this),
                 want, dtype_);
}

Eigen::Index Tensor::rows2d() const {
  return shape_.rank() == 0 ? 1 : shape_.outer(shape_.rank() - 1);
}
Eigen::Index Tensor::cols2d() const { return shape_.rank() == 0 ? 1 : shape_[shape_.rank() - 1]; }

Tensor Tensor::slice(int dim, std::int64_t start, std::int64_t size) const {
  const SliceBytes l =
      checked_slice(shape_, dtype_, dim, start, size, [&] { return describe(*this); });
  Tensor out(shape_.with(l.dim, size), dtype_);
  if (l.run == 0) return out;
  for (std::int64_t o = 0; o < l.rows; ++o) {
    std::memcpy(out.bytes() + o * l.run, bytes() + o * l.stride + l.offset, l.run);
  }
  return out;
}

void Tensor::assign_slice(int dim, std::int64_t start, const Tensor& src) {
  const SliceBytes l = checked_assign(shape_, dtype_, src.shape_, src.dtype_, dim, start);
  if (l.run == 0) return;
  for (std::int64_t o = 0; o < l.rows; ++o) {
    std::memcpy(bytes() + o * l.stride + l.offset, src.bytes() + o * l.run, l.run);
  }
}

Tensor Tensor::reshape(Shape shape) const {
  MESHTEST_CHECK(shape.numel() == numel(), "reshape: {} has {} elements, {} has {}", shape_,
                 numel(), shape, shape.numel());
  Tensor out = *this;
  out.shape_ = shape;
  return out;
}

Tensor Tensor::astype(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out(shape_, dtype);
  visit_dtype(dtype_, [&]<class S>(type_tag<S>) {
    visit_dtype(dtype,
                [&]<class D>(type_tag<D>) { out.vector<D>() = vector<S>().template cast<D>(); });
  });
  return out;
}

bool Tensor::bitwise_equal(const Tensor& other) const {
  return dtype_ == other.dtype_ && shape_ == other.shape_ && data_ == other.data_;
}

double Tensor::item(std::int64_t i) const {
  MESHTEST_CHECK(i >= 0 && i < numel(), "item: index {} out of range [0, {})", i, numel());
  return visit_dtype(dtype_,
                     [&]<class T>(type_tag<T>) { return static_cast<double>(data<T>()[i]); });
}

void Tensor::fill(double v) {
  visit_dtype(dtype_, [&]<class T>(type_tag<T>) { vector<T>().setConstant(static_cast<T>(v)); });
}

Tensor concat(const std::vector<Tensor>& parts, int dim) {
  const auto [d, total] = checked_concat(parts, dim);
  Tensor out(parts.front().shape().with(d, total), parts.front().dtype());
  write_parts(out, parts, d);
  return out;
}

std::vector<Tensor> split(const Tensor& t, int p, int dim) { return split_parts(t, p, dim); }

std::string describe(const Tensor& t) { return fmt::format("{}{}", t.dtype(), t.shape()); }

}  // namespace meshtest
