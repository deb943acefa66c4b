// attention_keys: the keys a query row of sdpa_sinks sees, for the attention kernels' .cu files.
#pragma once

#include <cstdint>

namespace meshtest::gpu::detail {

/// The keys [first, last] (rows of the keys; empty when first > last) that a query at position
/// q_pos sees when key row j is at position k_offset + j and there are tk of them: causal
/// (k_offset + j <= q_pos) and, with a window > 0, q_pos - (k_offset + j) < window.
__device__ __forceinline__ void keys_seen(std::int64_t q_pos, std::int64_t k_offset,
                                          std::int64_t tk, std::int64_t window, std::int64_t& first,
                                          std::int64_t& last) {
  first = 0;
  last = q_pos - k_offset;
  if (window > 0) {
    const std::int64_t lo = q_pos - window + 1 - k_offset;
    first = lo > 0 ? lo : 0;
  }
  if (last > tk - 1) last = tk - 1;
}

/// The sequence of query row `row` of a batch (an SdpaBatch of attention_kernel.hpp; rows
/// counted from b.seq[0].row) and the keys [lo, hi] of its chunk c of chunk_keys keys (empty
/// when lo > hi), for launch_sdpa_batch's kernels.
template <class Batch>
__device__ __forceinline__ const auto& batch_chunk(const Batch& b, std::int64_t row, std::int64_t c,
                                                   std::int64_t chunk_keys, std::int64_t window,
                                                   std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t base = b.seq[0].row;
  int i = 0;
  while (i + 1 < b.n && row >= b.seq[i].row - base + b.seq[i].rows) ++i;
  const auto& r = b.seq[i];
  std::int64_t first = 0, last = -1;
  keys_seen(r.q_offset + (base + row - r.row), r.k_offset, r.tk, window, first, last);
  lo = first + c * chunk_keys;
  hi = last < lo + chunk_keys - 1 ? last : lo + chunk_keys - 1;
  return r;
}

}  // namespace meshtest::gpu::detail
