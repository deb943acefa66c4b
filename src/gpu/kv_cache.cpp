// kv_cache (GPU): the CPU cache's checks (src/ops/kv_cache.hpp), rows copied a run of consecutive
// positions at a time (write), or every cache's rows of a batch in one launch (write_rows,
// write_batch).
#include "src/gpu/kv_cache.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "src/gpu/elementwise_kernel.hpp"
#include "src/gpu/op_timer.hpp"
#include "src/gpu/runtime.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/ops/kv_cache.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu {

DeviceKvCache::DeviceKvCache(std::int64_t max_len, std::int64_t kv_heads, std::int64_t head_dim,
                             DType dtype)
    : max_len_(max_len), kv_heads_(kv_heads), head_dim_(head_dim) {
  MESHTEST_CHECK(max_len > 0 && kv_heads > 0 && head_dim > 0,
                 "gpu KvCache: max_len {}, kv_heads {} and head_dim {} must be > 0", max_len,
                 kv_heads, head_dim);
  MESHTEST_CHECK(dtype == DType::f32 || dtype == DType::bf16,
                 "gpu KvCache: dtype {} is not f32 or bf16", dtype);
  k_ = DeviceTensor(Shape{max_len, kv_heads, head_dim}, dtype);
  v_ = DeviceTensor(Shape{max_len, kv_heads, head_dim}, dtype);
  written_.assign(static_cast<std::size_t>(max_len), false);
}

void DeviceKvCache::write(const DeviceTensor& k, const DeviceTensor& v,
                          std::span<const std::int64_t> positions) {
  constexpr std::string_view op = "gpu KvCache::write";
  perf::OpScope scope("kv_cache_write");
  scope.input(info(k)).input(info(v));
  const auto n = static_cast<std::int64_t>(positions.size());
  const Shape want{n, kv_heads_, head_dim_};
  MESHTEST_CHECK(k.shape() == want && v.shape() == want,
                 "{}: k is {} and v {}, expected {}[{}, {}, {}] each", op, describe(k), describe(v),
                 dtype(), n, kv_heads_, head_dim_);
  check_dtype(op, "k", k, dtype());
  check_dtype(op, "v", v, dtype());
  check_on_device(op, "k", k, k_.device());
  check_on_device(op, "v", v, k_.device());
  check_cache_positions(op, positions, max_len_);
  for (std::int64_t i = 0; i < n;) {  // a run of consecutive positions: one copy each
    std::int64_t run = 1;
    while (i + run < n && positions[i + run] == positions[i] + run) ++run;
    k_.assign_slice(0, positions[i], k.slice(0, i, run));
    v_.assign_slice(0, positions[i], v.slice(0, i, run));
    for (std::int64_t r = 0; r < run; ++r)
      written_[static_cast<std::size_t>(positions[i + r])] = true;
    i += run;
  }
  scope.bytes(static_cast<std::int64_t>(k.nbytes() + v.nbytes()));
}

void DeviceKvCache::write_rows(const DeviceTensor& k, const DeviceTensor& v, std::int64_t row,
                               std::int64_t n, std::int64_t first, cudaStream_t stream) {
  const KvCacheRows one{.cache = this, .row = row, .n = n, .first = first};
  write_entries("gpu KvCache::write_rows", false, k, v, std::span(&one, 1), stream);
}

void DeviceKvCache::write_batch(const DeviceTensor& k, const DeviceTensor& v,
                                std::span<const KvCacheRows> writes, cudaStream_t stream) {
  write_entries("gpu KvCache::write_batch", true, k, v, writes, stream);
}

void DeviceKvCache::write_entries(std::string_view op, bool named, const DeviceTensor& k,
                                  const DeviceTensor& v, std::span<const KvCacheRows> writes,
                                  cudaStream_t stream) {
  perf::OpScope scope("kv_cache_write");
  scope.input(info(k)).input(info(v));
  for (std::size_t i = 0; i < writes.size(); ++i) {
    const KvCacheRows& w = writes[i];
    const std::string at = named ? fmt::format("{} (write {})", op, i) : std::string(op);
    MESHTEST_CHECK(w.cache != nullptr, "{}: no cache", at);
    const DeviceKvCache& c = *w.cache;
    MESHTEST_CHECK(k.rank() == 3 && k.shape() == v.shape() && k.shape()[1] == c.kv_heads_ &&
                       k.shape()[2] == c.head_dim_,
                   "{}: k is {} and v {}, expected {}[m, {}, {}] each", at, describe(k),
                   describe(v), c.dtype(), c.kv_heads_, c.head_dim_);
    check_dtype(at, "k", k, c.dtype());
    check_dtype(at, "v", v, c.dtype());
    check_on_device(at, "k", k, c.k_.device());
    check_on_device(at, "v", v, c.k_.device());
    MESHTEST_CHECK(w.row >= 0 && w.n >= 0 && w.row + w.n <= k.shape()[0],
                   "{}: rows [{}, {}) are not within k's {} rows", at, w.row, w.row + w.n,
                   k.shape()[0]);
    MESHTEST_CHECK(w.first >= 0 && w.first + w.n <= c.max_len_,
                   "{}: positions [{}, {}) are not within [0, {})", at, w.first, w.first + w.n,
                   c.max_len_);
    for (std::size_t j = 0; j < i; ++j) {
      const KvCacheRows& o = writes[j];
      const bool apart = o.cache != w.cache || o.first + o.n <= w.first || w.first + w.n <= o.first;
      MESHTEST_CHECK(apart || o.n == 0 || w.n == 0,
                     "{}: positions [{}, {}) overlap write {}'s [{}, {}) of the same cache", at,
                     w.first, w.first + w.n, j, o.first, o.first + o.n);
    }
  }
  if (writes.empty() || k.shape()[0] == 0) return;
  const std::size_t row_bytes = k.nbytes() / static_cast<std::size_t>(k.shape()[0]);
  const auto at = [&](std::int64_t i) { return static_cast<std::size_t>(i) * row_bytes; };
  const DeviceGuard guard(k.device());
  time_on_stream(scope, stream);  // last before the launches (see linear)
  detail::CopyBatch batch;
  const auto launch = [&] {
    MESHTEST_CUDA_CHECK(detail::launch_copy_batch(batch, stream));
    batch.n = 0;
  };
  const auto add = [&](std::byte* to, const std::byte* from, std::size_t bytes) {
    batch.dst[batch.n] = to;
    batch.src[batch.n] = from;
    batch.bytes[batch.n] = static_cast<std::int64_t>(bytes);
    if (++batch.n == detail::CopyBatch::kMax) launch();
  };
  std::size_t total = 0;
  for (const KvCacheRows& w : writes) {
    if (w.n == 0) continue;
    const std::size_t size = at(w.n);
    add(w.cache->k_.bytes() + at(w.first), k.bytes() + at(w.row), size);
    add(w.cache->v_.bytes() + at(w.first), v.bytes() + at(w.row), size);
    for (std::int64_t r = w.first; r < w.first + w.n; ++r)
      w.cache->written_[static_cast<std::size_t>(r)] = true;
    total += 2 * size;
  }
  if (batch.n > 0) launch();
  scope.bytes(static_cast<std::int64_t>(total));
}

namespace {

DeviceTensor read_rows(std::string_view op, const DeviceTensor& cache, std::int64_t begin,
                       std::int64_t end) {
  perf::OpScope scope("kv_cache_read");
  const std::int64_t max_len = cache.shape()[0];
  MESHTEST_CHECK(0 <= begin && begin <= end && end <= max_len,
                 "{}: range [{}, {}) is not within [0, {}] with begin <= end", op, begin, end,
                 max_len);
  DeviceTensor out = cache.slice(0, begin, end - begin);
  scope.output(info(out));
  return out;
}

}  // namespace

DeviceTensor DeviceKvCache::keys(std::int64_t begin, std::int64_t end) const {
  return read_rows("gpu KvCache::keys", k_, begin, end);
}

DeviceTensor DeviceKvCache::values(std::int64_t begin, std::int64_t end) const {
  return read_rows("gpu KvCache::values", v_, begin, end);
}

std::int64_t DeviceKvCache::window_begin(std::int64_t pos, std::int64_t window) const {
  return cache_window_begin("gpu KvCache::window_begin", pos, window, max_len_);
}

bool DeviceKvCache::written(std::int64_t p) const {
  MESHTEST_CHECK(p >= 0 && p < max_len_, "gpu KvCache::written: position {} is outside [0, {})", p,
                 max_len_);
  return written_[static_cast<std::size_t>(p)];
}

std::int64_t DeviceKvCache::length() const {
  const auto last = std::find(written_.rbegin(), written_.rend(), true);
  return static_cast<std::int64_t>(written_.rend() - last);
}

}  // namespace meshtest::gpu
