// reduce: the one element-wise reduction of every CCL path (axis order; bf16 and f16 in f32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "dist/ccl/options.hpp"
#include "src/core/dtype.hpp"

namespace meshtest::dist::detail {

/// dst[k] = terms[0][k] op terms[1][k] op ... op terms[p-1][k] for k < n, combined in this
/// order (the axis order) on every path of every CCL, so every device and every path (shared
/// memory, node chain, MPI) give the same bits. bf16 and f16 accumulate all p terms in f32 and
/// round once (to nearest even) at the end, never once per addition. avg divides the sum by p in
/// f32 (f64 for f64) before that one rounding. Integer sums wrap (two's complement), as MPI's do.
/// dst may be one of the terms. t must not be u8, and avg needs a floating t
/// (Call::check_reduce_op has checked both).
///
/// Sums and averages read the p terms side by side when the call they serve reads
/// kSideBySideFrom bytes or more (`footprint`: what the whole collective reads on this device,
/// when it reduces in several pieces; 0: n elements of every term), where the terms come from
/// memory and the hardware prefetchers must follow every stream; below that, where they come
/// from the caches, one term's tile after another. Either way the same additions in the same
/// order: the same bits.
void reduce(std::byte* dst, std::span<const std::byte* const> terms, std::int64_t n, DType t,
            ReduceOp op, std::size_t footprint = 0);

/// See reduce(): from this many bytes read, sums read their terms side by side.
inline constexpr std::size_t kSideBySideFrom = std::size_t{8} << 20;

/// Bytes per element of reduce()'s accumulator: 4 for bf16 and f16 (f32), else dtype_size(t).
std::size_t accumulator_size(DType t);

/// Where a reduction of terms that arrive in consecutive groups stands (the node chain's
/// all_reduce, paths/node_chain/node_chain.hpp): `carry` is the unrounded accumulator of every
/// earlier group's terms (accumulator_size(t) bytes an element), or null for the first group;
/// `last` says whether this group is the last, and `total` counts the terms of all groups.
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
                  ReduceOp op, const Stage& stage, std::size_t footprint = 0);

}  // namespace meshtest::dist::detail
