// reduce: the one element-wise reduction of every CCL path (axis order; bf16 in f32), and the
// MPI path's direct reduce-scatter built on it.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dist/ccl/options.hpp"
#include "src/core/dtype.hpp"

namespace meshtest::dist::detail {

/// dst[k] = terms[0][k] op terms[1][k] op ... op terms[p-1][k] for k < n, combined in this
/// order (the axis order) on every path of every CCL, so every device and both paths (shared
/// memory and MPI) give the same bits. bf16 accumulates all p terms in f32 and rounds once at
/// the end, never once per addition. avg divides the sum by p before that one rounding.
/// Integer sums wrap (two's complement), as MPI's do. dst may be one of the terms. t must not
/// be u8, and avg needs a floating t (Call::check_reduce_op has checked both).
void reduce(std::byte* dst, std::span<const std::byte* const> terms, std::int64_t n, DType t,
            ReduceOp op);

/// Bytes per element of reduce()'s accumulator: 4 for bf16 (f32), else dtype_size(t).
std::size_t accumulator_size(DType t);

/// Where a reduction of terms that arrive in consecutive groups stands (the node chain's
/// all_reduce, node_chain.hpp): `carry` is the unrounded accumulator of every earlier group's
/// terms (accumulator_size(t) bytes an element), or null for the first group; `last` says
/// whether this group is the last, and `total` counts the terms of all groups.
struct Stage {
  const std::byte* carry = nullptr;
  bool last = true;
  std::int64_t total = 0;
};

/// reduce() over one group of terms as a stage of a longer reduction: the accumulator starts
/// from stage.carry (then terms[0], ...) when there is one; a last stage rounds into dst as
/// reduce() does (avg dividing by stage.total), any other stores the accumulator in dst for
/// the next stage's carry. Stages chained over consecutive groups in axis order give reduce()'s
/// bits over all the terms: the same additions in the same order, one rounding.
void reduce_stage(std::byte* dst, std::span<const std::byte* const> terms, std::int64_t n, DType t,
                  ReduceOp op, const Stage& stage);

/// The MPI path's reduce-scatter of blocks laid end to end: block j (counts[j] elements, at
/// byte offset offsets[j]) of every device goes straight to device j (MPI_Isend/MPI_Irecv on
/// `comm`, one step, (p-1)/p of the input sent and received per device, the bandwidth
/// minimum), which then reduces the p blocks with reduce(), in axis order. Owns its
/// workspaces, so a cached plan reuses them.
class DirectReduceScatter {
 public:
  DirectReduceScatter() = default;
  /// `counts`: every device's block, in elements of t; this device is `index` of p.
  DirectReduceScatter(std::vector<int> counts, DType t, int index);
  /// Reduces this device's block of every device's `blocks` into out (out may alias this
  /// device's own block of `blocks`). Collective over comm (p devices, this one `index`).
  void run(const std::byte* blocks, std::byte* out, MPI_Datatype mpi_t, ReduceOp op, MPI_Comm comm);
  const std::vector<int>& counts() const { return counts_; }

 private:
  std::vector<int> counts_;
  std::vector<std::size_t> offsets_;  // bytes
  DType t_ = DType::f32;
  int index_ = 0;
  std::size_t received_bytes_ = 0;
  std::vector<std::byte> received_;  // this device's block from each device (own slot unused)
  std::vector<MPI_Request> requests_;
  std::vector<const std::byte*> terms_;
};

}  // namespace meshtest::dist::detail
