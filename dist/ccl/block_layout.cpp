// Block layouts of a tensor along a dim: packing into MPI's end-to-end order, and the derived
// datatype that reads equal blocks in place.
#include "dist/ccl/block_layout.hpp"

#include <algorithm>
#include <climits>
#include <cstring>

#include "dist/mesh/mpi_check.hpp"

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

OwnedType OwnedType::blocks(const BlockLayout& l) {
  OwnedType t;
  if (l.direct() || l.sizes.empty()) return t;
  if (!std::ranges::all_of(l.sizes, [&](std::int64_t s) { return s == l.sizes[0]; })) return t;
  const std::size_t run = static_cast<std::size_t>(l.sizes[0]) * l.view.inner_bytes;
  const std::size_t row = run * l.sizes.size();
  if (run == 0 || row > INT_MAX || l.view.outer > INT_MAX) return t;
  MPI_Datatype v = MPI_DATATYPE_NULL;
  MESHTEST_MPI(MPI_Type_vector(static_cast<int>(l.view.outer), static_cast<int>(run),
                               static_cast<int>(row), MPI_BYTE, &v));
  MESHTEST_MPI(MPI_Type_create_resized(v, 0, static_cast<MPI_Aint>(run), &t.type_));
  MPI_Type_free(&v);
  MESHTEST_MPI(MPI_Type_commit(&t.type_));
  return t;
}

OwnedType::~OwnedType() {
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (type_ != MPI_DATATYPE_NULL && finalized == 0) MPI_Type_free(&type_);
}

}  // namespace meshtest::dist::detail
