// Block layouts of a tensor along a dim: packing into MPI's end-to-end order and back.
#include "dist/ccl/block_layout.hpp"

#include <algorithm>
#include <cstring>

#include "dist/ccl/copy.hpp"

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
    : view(dim_view(s, t, d)), sizes(std::move(sz)) {
  for (std::int64_t n : sizes) {
    starts_.push_back(row_);
    row_ += static_cast<std::size_t>(n) * view.inner_bytes;
  }
}

template <bool kToPacked>
void BlockLayout::copy_range(std::byte* packed, std::byte* tensor, std::size_t j, std::size_t off,
                             std::size_t len, bool stream) const {
  const std::size_t run = static_cast<std::size_t>(sizes[j]) * view.inner_bytes;
  if (len == 0 || run == 0) return;
  std::size_t o = off / run, c = off % run;  // outer row and byte within the block's run
  while (len > 0) {
    const std::size_t n = std::min(len, run - c);
    std::byte* at = tensor + o * row_ + starts_[j] + c;
    if (kToPacked) {
      copy_bytes(packed, at, n);
    } else {
      stream ? copy_streaming(at, packed, n) : copy_bytes(at, packed, n);
    }
    packed += n;
    len -= n;
    ++o;
    c = 0;
  }
}

void BlockLayout::pack_range(const std::byte* tensor, std::size_t j, std::size_t off,
                             std::size_t len, std::byte* to) const {
  copy_range<true>(to, const_cast<std::byte*>(tensor), j, off, len, false);  // reads the tensor
}

void BlockLayout::unpack_range(const std::byte* from, std::size_t j, std::size_t off,
                               std::size_t len, std::byte* tensor, bool stream) const {
  copy_range<false>(const_cast<std::byte*>(from), tensor, j, off, len, stream);  // reads `from`
}

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

const std::byte* BlockLayout::packed(const std::byte* tensor, std::vector<std::byte>& workspace,
                                     std::size_t bytes) const {
  if (direct()) return tensor;
  workspace.resize(bytes);
  pack(tensor, workspace.data());
  return workspace.data();
}

}  // namespace meshtest::dist::detail
