// kv_cache: keys and values of past positions, written at positions and read as a window.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "src/core/tensor.hpp"

namespace meshtest {

/// Throws Error (prefixed by `op`) for a position outside [0, max_len) or one that appears twice
/// in `positions`: the rule of a cache write (KvCache here, gpu::DeviceKvCache on a GPU).
void check_cache_positions(std::string_view op, std::span<const std::int64_t> positions,
                           std::int64_t max_len);

/// The window of a cache of max_len positions ending at `pos` (inclusive) of at most `window`
/// positions (0: from position 0): its first position, max(0, pos + 1 − window). Throws Error
/// (prefixed by `op`) for a pos outside [0, max_len) or a negative window.
std::int64_t cache_window_begin(std::string_view op, std::int64_t pos, std::int64_t window,
                                std::int64_t max_len);

/// A cache of max_len positions × kv_heads × head_dim for keys and for values, one dtype.
/// Positions never written read as zero, and reads say which positions are valid.
class KvCache {
 public:
  /// Throws Error for a non-positive size or a non-floating dtype.
  KvCache(std::int64_t max_len, std::int64_t kv_heads, std::int64_t head_dim, DType dtype);

  /// Stores k[i], v[i] (each [n, kv_heads, head_dim]) at positions[i] (n = positions.size(),
  /// may be 0). Overwrites what was there. Throws Error for a position outside [0, max_len),
  /// a repeated position within one call, or shapes/dtypes that do not fit.
  void write(const Tensor& k, const Tensor& v, std::span<const std::int64_t> positions);

  /// Keys and values of positions [begin, end): [end − begin, kv_heads, head_dim] each.
  /// Throws Error unless 0 <= begin <= end <= max_len.
  [[nodiscard]] Tensor keys(std::int64_t begin, std::int64_t end) const;
  [[nodiscard]] Tensor values(std::int64_t begin, std::int64_t end) const;
  /// The window ending at `pos` (inclusive) of at most `window` positions (0: from position 0):
  /// [max(0, pos + 1 − window), pos + 1). Returns the first position of it. Throws Error for a
  /// pos outside [0, max_len) or a negative window.
  [[nodiscard]] std::int64_t window_begin(std::int64_t pos, std::int64_t window) const;
  /// Whether position p has been written. Throws Error for a p outside [0, max_len).
  [[nodiscard]] bool written(std::int64_t p) const;
  /// One past the highest written position (0 when empty).
  [[nodiscard]] std::int64_t length() const;

  [[nodiscard]] std::int64_t max_len() const { return max_len_; }
  [[nodiscard]] std::int64_t kv_heads() const { return kv_heads_; }
  [[nodiscard]] std::int64_t head_dim() const { return head_dim_; }
  [[nodiscard]] DType dtype() const { return k_.dtype(); }

 private:
  std::int64_t max_len_, kv_heads_, head_dim_;
  Tensor k_, v_;               // [max_len, kv_heads, head_dim]
  std::vector<bool> written_;  // [max_len]
};

}  // namespace meshtest
