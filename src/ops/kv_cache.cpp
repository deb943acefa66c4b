// kv_cache: KvCache's row copies and range checks.
#include "src/ops/kv_cache.hpp"

#include <algorithm>
#include <cstring>

#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {

void check_cache_positions(std::string_view op, std::span<const std::int64_t> positions,
                           std::int64_t max_len) {
  std::vector<bool> seen(static_cast<std::size_t>(max_len), false);
  for (std::size_t i = 0; i < positions.size(); ++i) {
    const std::int64_t p = positions[i];
    MESHTEST_CHECK(p >= 0 && p < max_len, "{}: position {} (row {}) is outside [0, {})", op, p, i,
                   max_len);
    MESHTEST_CHECK(!seen[static_cast<std::size_t>(p)],
                   "{}: position {} appears twice in one call (row {})", op, p, i);
    seen[static_cast<std::size_t>(p)] = true;
  }
}

std::int64_t cache_window_begin(std::string_view op, std::int64_t pos, std::int64_t window,
                                std::int64_t max_len) {
  MESHTEST_CHECK(pos >= 0 && pos < max_len && window >= 0,
                 "{}: position {} must be in [0, {}) and window {} >= 0", op, pos, max_len, window);
  return window == 0 ? 0 : std::max<std::int64_t>(0, pos + 1 - window);
}

KvCache::KvCache(std::int64_t max_len, std::int64_t kv_heads, std::int64_t head_dim, DType dtype)
    : max_len_(max_len), kv_heads_(kv_heads), head_dim_(head_dim) {
  MESHTEST_CHECK(max_len > 0 && kv_heads > 0 && head_dim > 0,
                 "KvCache: max_len {}, kv_heads {} and head_dim {} must be > 0", max_len, kv_heads,
                 head_dim);
  MESHTEST_CHECK(is_floating(dtype), "KvCache: dtype {} is not floating (f32, f64, bf16 or f16)",
                 dtype);
  k_ = Tensor(Shape{max_len, kv_heads, head_dim}, dtype);
  v_ = Tensor(Shape{max_len, kv_heads, head_dim}, dtype);
  written_.assign(static_cast<std::size_t>(max_len), false);
}

void KvCache::write(const Tensor& k, const Tensor& v, std::span<const std::int64_t> positions) {
  constexpr std::string_view op = "KvCache::write";
  perf::OpScope scope("kv_cache_write");
  scope.input(k).input(v);
  const auto n = static_cast<std::int64_t>(positions.size());
  const Shape want{n, kv_heads_, head_dim_};
  detail::check_shape(op, "k", k, want);
  detail::check_shape(op, "v", v, want);
  detail::check_dtype(op, "k", k, dtype());
  detail::check_dtype(op, "v", v, dtype());
  check_cache_positions(op, positions, max_len_);
  const std::size_t row = static_cast<std::size_t>(kv_heads_ * head_dim_) * dtype_size(dtype());
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t p = positions[i];
    std::memcpy(k_.bytes() + p * row, k.bytes() + i * row, row);
    std::memcpy(v_.bytes() + p * row, v.bytes() + i * row, row);
    written_[p] = true;
  }
  scope.bytes(static_cast<std::int64_t>(2 * row) * n);
}

namespace {

Tensor read_rows(std::string_view op, const Tensor& cache, std::int64_t begin, std::int64_t end) {
  perf::OpScope scope("kv_cache_read");
  const std::int64_t max_len = cache.shape()[0];
  MESHTEST_CHECK(0 <= begin && begin <= end && end <= max_len,
                 "{}: range [{}, {}) is not within [0, {}] with begin <= end", op, begin, end,
                 max_len);
  Tensor out = cache.slice(0, begin, end - begin);
  scope.output(out);
  return out;
}

}  // namespace

Tensor KvCache::keys(std::int64_t begin, std::int64_t end) const {
  return read_rows("KvCache::keys", k_, begin, end);
}

Tensor KvCache::values(std::int64_t begin, std::int64_t end) const {
  return read_rows("KvCache::values", v_, begin, end);
}

std::int64_t KvCache::window_begin(std::int64_t pos, std::int64_t window) const {
  return cache_window_begin("KvCache::window_begin", pos, window, max_len_);
}

bool KvCache::written(std::int64_t p) const {
  MESHTEST_CHECK(p >= 0 && p < max_len_, "KvCache::written: position {} is outside [0, {})", p,
                 max_len_);
  return written_[p];
}

std::int64_t KvCache::length() const {
  const auto last = std::find(written_.rbegin(), written_.rend(), true);
  return static_cast<std::int64_t>(written_.rend() - last);
}

}  // namespace meshtest
