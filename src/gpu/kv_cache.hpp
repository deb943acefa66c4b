// kv_cache (GPU): keys and values of past positions in a GPU's memory, written at positions and
// read as a window, with the CPU KvCache's contract (src/ops/kv_cache.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "src/gpu/device_tensor.hpp"

namespace meshtest::gpu {

class DeviceKvCache;

/// One cache's part of DeviceKvCache::write_batch: rows [row, row + n) of k and v stored at
/// positions [first, first + n) of *cache.
struct KvCacheRows {
  DeviceKvCache* cache = nullptr;
  std::int64_t row = 0, n = 0, first = 0;
};

/// KvCache on the current GPU: [max_len, kv_heads, head_dim] for keys and for values, one dtype,
/// zero where never written; the bookkeeping of written positions on the host. Every member is
/// complete when it returns (DeviceTensor's copies). Reads are copies of the rows asked for,
/// ready for sdpa_sinks (src/gpu/sdpa.hpp) with k_offset = the window's first position.
class DeviceKvCache {
 public:
  /// Throws Error for a non-positive size or a dtype other than f32 or bf16.
  DeviceKvCache(std::int64_t max_len, std::int64_t kv_heads, std::int64_t head_dim, DType dtype);

  /// Stores k[i], v[i] ([n, kv_heads, head_dim] each, on the cache's GPU) at positions[i]: one
  /// copy per run of consecutive positions (a prefill's n rows are one). Errors as KvCache's
  /// (a position outside [0, max_len), a repeated one, shapes or dtypes that do not fit), and
  /// for tensors on another GPU.
  void write(const DeviceTensor& k, const DeviceTensor& v, std::span<const std::int64_t> positions);

  /// Stores rows [row, row + n) of k and v ([m, kv_heads, head_dim] each, m >= row + n, on the
  /// cache's GPU) at positions [first, first + n), queued on `stream` without waiting: one
  /// kernel launch and no temporaries, for a step that writes caches and then reads them in the
  /// stream's order. k and v must stay alive and unchanged until the stream has run the copies.
  /// Errors as write's, and for rows outside k.
  void write_rows(const DeviceTensor& k, const DeviceTensor& v, std::int64_t row, std::int64_t n,
                  std::int64_t first, cudaStream_t stream);

  /// write_rows for many caches at once: every entry's rows, keys and values, in one kernel
  /// launch on `stream` (up to 64 entries; more take a launch per 64), queued without waiting,
  /// for a batch decode's sequences (the model's: one launch for its 64 caches). Each entry is
  /// checked as write_rows's, named by its index; entries of one cache must not share a
  /// position (the copies run in no order). k and v must stay alive and unchanged until the
  /// stream has run the copies.
  static void write_batch(const DeviceTensor& k, const DeviceTensor& v,
                          std::span<const KvCacheRows> writes, cudaStream_t stream);

  /// Keys and values of positions [begin, end): [end − begin, kv_heads, head_dim] each. Throws
  /// Error unless 0 <= begin <= end <= max_len.
  [[nodiscard]] DeviceTensor keys(std::int64_t begin, std::int64_t end) const;
  [[nodiscard]] DeviceTensor values(std::int64_t begin, std::int64_t end) const;
  /// KvCache::window_begin's rule: max(0, pos + 1 − window) (window 0: 0).
  [[nodiscard]] std::int64_t window_begin(std::int64_t pos, std::int64_t window) const;
  /// Whether position p has been written. Throws Error for a p outside [0, max_len).
  [[nodiscard]] bool written(std::int64_t p) const;
  /// One past the highest written position (0 when empty).
  [[nodiscard]] std::int64_t length() const;

  /// The whole key and value buffers, [max_len, kv_heads, head_dim] (zeros where never written),
  /// for sdpa_sinks_batch to read in place (src/gpu/sdpa.hpp).
  [[nodiscard]] const DeviceTensor& key_buffer() const { return k_; }
  [[nodiscard]] const DeviceTensor& value_buffer() const { return v_; }

  [[nodiscard]] std::int64_t max_len() const { return max_len_; }
  [[nodiscard]] std::int64_t kv_heads() const { return kv_heads_; }
  [[nodiscard]] std::int64_t head_dim() const { return head_dim_; }
  [[nodiscard]] DType dtype() const { return k_.dtype(); }

 private:
  // write_rows and write_batch: `named` puts each entry's index in the messages.
  static void write_entries(std::string_view op, bool named, const DeviceTensor& k,
                            const DeviceTensor& v, std::span<const KvCacheRows> writes,
                            cudaStream_t stream);

  std::int64_t max_len_, kv_heads_, head_dim_;
  DeviceTensor k_, v_;         // [max_len, kv_heads, head_dim]
  std::vector<bool> written_;  // [max_len]
};

}  // namespace meshtest::gpu
