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

}  // namespace meshtest::gpu::detail
