// slice_bytes: where a range along one dim of a row-major tensor lies, and the rules of slice,
// assign_slice, concat and split, shared by Tensor and gpu::DeviceTensor (one rule for both).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "src/core/dtype.hpp"
#include "src/core/error.hpp"
#include "src/core/shape.hpp"

namespace meshtest {

/// [start, start + size) along dim `dim` of a row-major tensor: `rows` runs of `run` bytes, the
/// first `offset` bytes in, one every `stride` bytes. The range stored alone (a slice) has its
/// runs back to back.
struct SliceBytes {
  int dim = 0;
  std::int64_t rows = 0;
  std::size_t offset = 0;
  std::size_t run = 0;
  std::size_t stride = 0;
};

/// The layout of a range already checked; `dim` normalized.
SliceBytes slice_bytes(const Shape& shape, DType t, int dim, std::int64_t start, std::int64_t size);

/// slice's check, an Error "slice [a, b) out of range along dim d of size n (tensor <name()>)",
/// then the range's layout.
template <class Name>
SliceBytes checked_slice(const Shape& shape, DType t, int dim, std::int64_t start,
                         std::int64_t size, Name&& name) {
  const int d = shape.normalize_dim(dim);
  const std::int64_t n = shape[d];
  MESHTEST_CHECK(start >= 0 && size >= 0 && start + size <= n,
                 "slice [{}, {}) out of range along dim {} of size {} (tensor {})", start,
                 start + size, d, n, name());
  return slice_bytes(shape, t, d, start, size);
}

/// assign_slice's checks of a tensor `src` (dtype src_t) written into one of `dst` (dst_t) at
/// `start` along dim: the dtypes, the other dims, the range. Then the range's layout in dst.
SliceBytes checked_assign(const Shape& dst, DType dst_t, const Shape& src, DType src_t, int dim,
                          std::int64_t start);

/// concat's checks of its parts (at least one; one dtype; the other dims equal): the dim,
/// normalized, and the parts' total along it.
template <class Parts>
std::pair<int, std::int64_t> checked_concat(const Parts& parts, int dim) {
  MESHTEST_CHECK(!parts.empty(), "concat: no tensors given");
  const auto& first = parts.front();
  const int d = first.shape().normalize_dim(dim);
  std::int64_t total = 0;
  for (const auto& p : parts) {
    MESHTEST_CHECK(p.dtype() == first.dtype(), "concat: dtypes differ ({} and {})", first.dtype(),
                   p.dtype());
    MESHTEST_CHECK(p.rank() == first.rank() && p.shape().with(d, first.shape()[d]) == first.shape(),
                   "concat along dim {}: shapes {} and {} differ in another dim", d, first.shape(),
                   p.shape());
    total += p.shape()[d];
  }
  return {d, total};
}

/// concat's copy, for Tensor and DeviceTensor: the parts one after another along d into out
/// (whose dim d is their total; checked_concat has checked them).
template <class T>
void write_parts(T& out, const std::vector<T>& parts, int d) {
  std::int64_t at = 0;
  for (const T& p : parts) {
    out.assign_slice(d, at, p);
    at += p.shape()[d];
  }
}

/// split's rule, for Tensor and DeviceTensor: p parts of t along dim by array_split (none for
/// p = 0).
template <class T>
std::vector<T> split_parts(const T& t, int p, int dim) {
  const int d = t.shape().normalize_dim(dim);
  MESHTEST_CHECK(p >= 0, "split: {} parts asked of {}{} along dim {}", p, t.dtype(), t.shape(), d);
  std::vector<T> out;
  out.reserve(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i) out.push_back(t.slice(d, split_range(t.shape()[d], p, i)));
  return out;
}

}  // namespace meshtest
