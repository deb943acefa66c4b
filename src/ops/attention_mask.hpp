// attention_mask: which keys a query sees (causal, sliding window, padding); shared with sdpa.
#pragma once

#include <cstdint>
#include <span>

#include "src/core/tensor.hpp"

namespace meshtest {

/// Masking rules. A query at position qp sees a key at position kp when
///   (not causal or kp <= qp) and (window == 0 or qp − kp < window) and the key is not padding.
struct MaskSpec {
  bool causal = true;
  std::int64_t sliding_window = 0;  ///< 0: none
};

/// Whether the query at qp sees the key at kp (padding aside): the one rule sdpa uses.
[[nodiscard]] constexpr bool key_visible(std::int64_t qp, std::int64_t kp, const MaskSpec& m) {
  return (!m.causal || kp <= qp) && (m.sliding_window <= 0 || qp - kp < m.sliding_window);
}

/// The mask as a tensor: [Tq, Tk] of `dtype` with 0 where visible and −inf where masked
/// (additive). Query i sits at q_offset + i, key j at k_offset + j; key_padding (empty, or
/// [Tk] with nonzero = padding) masks those keys for every query.
/// Throws Error for a negative window, Tq or Tk, a padding of the wrong length, or a dtype other
/// than f32, f64 or bf16.
Tensor attention_mask(std::int64_t tq, std::int64_t tk, const MaskSpec& m,
                      std::int64_t q_offset = 0, std::int64_t k_offset = 0,
                      std::span<const std::uint8_t> key_padding = {}, DType dtype = DType::f32);

}  // namespace meshtest
