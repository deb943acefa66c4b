// Consecutive blocks along one dim of a tensor: the [outer, n, inner] view, and packing the
// blocks end to end (the layout MPI's collectives and the shared-memory path want) and back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "src/core/tensor.hpp"

namespace meshtest::dist::detail {

/// A tensor seen around dim d as [outer, n, inner] with inner in bytes.
struct DimView {
  std::int64_t outer = 1;
  std::size_t inner_bytes = 0;
};
DimView dim_view(const Shape& s, DType t, int d);

/// Element counts of consecutive blocks of `sizes` along d of a tensor of shape s.
std::vector<std::int64_t> block_elems(const Shape& s, int d, std::span<const std::int64_t> sizes);

/// Consecutive blocks of `sizes` along dim d of a tensor seen as [outer, n, inner], and the
/// same blocks made contiguous ([outer, sizes[j], inner]) and laid end to end — the layout
/// MPI's collectives want. When outer == 1 the two layouts coincide (direct()): MPI reads and
/// writes the tensor itself. Otherwise one pass of memcpy runs (one per block and outer
/// index) moves the data between the tensor and a workspace — or, range by range, between the
/// tensor and the shared-memory slots (pack_range / unpack_range), with no workspace at all.
struct BlockLayout {
  BlockLayout() = default;
  BlockLayout(const Shape& s, DType t, int d, std::vector<std::int64_t> sizes);
  bool direct() const { return view.outer == 1; }
  /// tensor (strided) -> blocks end to end
  void pack(const std::byte* tensor, std::byte* packed) const;
  /// blocks end to end -> tensor (strided)
  void unpack(const std::byte* packed, std::byte* tensor) const;
  /// The tensor's blocks end to end: `tensor` itself when direct(), else packed into
  /// `workspace` (resized to the tensor's `bytes`: allocated by the first call).
  const std::byte* packed(const std::byte* tensor, std::vector<std::byte>& workspace,
                          std::size_t bytes) const;
  /// Bytes [off, off + len) of block j as it would be packed ([outer, sizes[j], inner]),
  /// copied from the tensor to `to`.
  void pack_range(const std::byte* tensor, std::size_t j, std::size_t off, std::size_t len,
                  std::byte* to) const;
  /// The inverse: `from` holds bytes [off, off + len) of packed block j; they go to the tensor
  /// (with streaming stores when `stream`: dist/ccl/copy.hpp).
  void unpack_range(const std::byte* from, std::size_t j, std::size_t off, std::size_t len,
                    std::byte* tensor, bool stream = false) const;

  DimView view;
  std::vector<std::int64_t> sizes;

 private:
  template <bool kToPacked>
  void copy_range(std::byte* packed, std::byte* tensor, std::size_t j, std::size_t off,
                  std::size_t len, bool stream) const;
  std::vector<std::size_t> starts_;  // byte offset of block j within a row
  std::size_t row_ = 0;              // bytes of one outer row: n * inner
};

}  // namespace meshtest::dist::detail
