// slice_layout: where a range along one dim of a row-major tensor lies, and the checks of
// slice, assign_slice and concat, shared by Tensor and gpu::DeviceTensor (one rule for both).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "src/core/dtype.hpp"
#include "src/core/error.hpp"
#include "src/core/shape.hpp"

namespace meshtest {

/// [start, start + size) along dim `dim` of a row-major tensor: `rows` runs of `run` bytes, the
/// first `offset` bytes in, one every `stride` bytes. The range stored alone (a slice) has its
/// runs back to back.
struct SliceLayout {
  int dim = 0;
  std::int64_t rows = 0;
  std::size_t offset = 0;
  std::size_t run = 0;
  std::size_t stride = 0;
};

/// The layout of a range already checked; `dim` normalized.
SliceLayout slice_layout(const Shape& shape, DType t, int dim, std::int64_t start,
                         std::int64_t size);

/// slice's check, an Error "slice [a, b) out of range along dim d of size n (tensor <name()>)",
/// then the range's layout.
template <class Name>
SliceLayout checked_slice(const Shape& shape, DType t, int dim, std::int64_t start,
                          std::int64_t size, Name&& name) {
  const int d = shape.normalize_dim(dim);
  const std::int64_t n = shape[d];
  MESHTEST_CHECK(start >= 0 && size >= 0 && start + size <= n,
                 "slice [{}, {}) out of range along dim {} of size {} (tensor {})", start,
                 start + size, d, n, name());
  return slice_layout(shape, t, d, start, size);
}

/// assign_slice's checks of a tensor `src` (dtype src_t) written into one of `dst` (dst_t) at
/// `start` along dim: the dtypes, the other dims, the range. Then the range's layout in dst.
SliceLayout checked_assign(const Shape& dst, DType dst_t, const Shape& src, DType src_t, int dim,
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

}  // namespace meshtest
