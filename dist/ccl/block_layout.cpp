// Block layouts of a tensor along a dim: packing into MPI's end-to-end order and back.
#include "dist/ccl/block_layout.hpp"

#include <cstring>

namespace meshtest::dist::detail {

DimView dim_view(const Shape& s, DType t, int d) {
  return {s.outer(d), static_cast<std::size_t>(s.inner(d)) * dtype_size(t)};
}

std::vector<std::int64_t> block_elems(const Shape& s, int d, std::span<const std::int64_t> sizes) {
  std::vector<std::int64_t> out;
  for (std::int64_t n : sizes) out.push_back(s.outer(d) * n * s.inner(d));
  return out;
}

BlockLayout::BlockLayout(const Shape& s, DType t, int d, std::vector<std::int64_t> sz)
    : view(dim_view(s, t, d)), sizes(std::move(sz)) {}

namespace {
// Moves blocks between [outer, n, inner] (`strided`) and blocks laid end to end (`packed`).
template <bool kToPacked>
void copy_blocks(std::byte* packed, std::byte* strided, DimView v,
                 std::span<const std::int64_t> sizes) {
  std::int64_t n = 0;
  for (std::int64_t s : sizes) n += s;
  const std::size_t row = static_cast<std::size_t>(n) * v.inner_bytes;
  std::size_t start = 0;
  for (std::int64_t s : sizes) {
    const std::size_t run = static_cast<std::size_t>(s) * v.inner_bytes;
    for (std::int64_t o = 0; run > 0 && o < v.outer; ++o) {
      std::byte* at = strided + static_cast<std::size_t>(o) * row + start;
      kToPacked ? std::memcpy(packed, at, run) : std::memcpy(at, packed, run);
      packed += run;
    }
    start += run;
  }
}
}  // namespace

void BlockLayout::pack(const std::byte* tensor, std::byte* packed) const {
  // copy_blocks only reads the strided side when packing.
  copy_blocks<true>(packed, const_cast<std::byte*>(tensor), view, sizes);
}

void BlockLayout::unpack(const std::byte* packed, std::byte* tensor) const {
  copy_blocks<false>(const_cast<std::byte*>(packed), tensor, view, sizes);
}

}  // namespace meshtest::dist::detail
