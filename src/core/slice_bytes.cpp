// slice_bytes: the byte layout of a range along one dim, and assign_slice's checks.
#include "src/core/slice_bytes.hpp"

namespace meshtest {

SliceBytes slice_bytes(const Shape& shape, DType t, int dim, std::int64_t start,
                       std::int64_t size) {
  const std::size_t inner = static_cast<std::size_t>(shape.inner(dim)) * dtype_size(t);
  return {.dim = dim,
          .rows = shape.outer(dim),
          .offset = static_cast<std::size_t>(start) * inner,
          .run = static_cast<std::size_t>(size) * inner,
          .stride = static_cast<std::size_t>(shape[dim]) * inner};
}

SliceBytes checked_assign(const Shape& dst, DType dst_t, const Shape& src, DType src_t, int dim,
                          std::int64_t start) {
  const int d = dst.normalize_dim(dim);
  MESHTEST_CHECK(src_t == dst_t, "assign_slice: dtype {} into a tensor of dtype {}", src_t, dst_t);
  MESHTEST_CHECK(src.rank() == dst.rank() && src.with(d, dst[d]) == dst,
                 "assign_slice: shape {} does not fit {} along dim {}", src, dst, d);
  const std::int64_t size = src[d];
  MESHTEST_CHECK(start >= 0 && start + size <= dst[d],
                 "assign_slice: [{}, {}) out of range along dim {} of size {}", start, start + size,
                 d, dst[d]);
  return slice_bytes(dst, dst_t, d, start, size);
}

}  // namespace meshtest
