// kv_cache (GPU): the CPU cache's checks (src/ops/kv_cache.hpp), rows copied a run of consecutive
// positions at a time.
#include "src/gpu/kv_cache.hpp"

#include <algorithm>
#include <string_view>

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
  constexpr std::string_view op = "gpu KvCache::write_rows";
  perf::OpScope scope("kv_cache_write");
  scope.input(info(k)).input(info(v));
  MESHTEST_CHECK(k.rank() == 3 && k.shape() == v.shape() && k.shape()[1] == kv_heads_ &&
                     k.shape()[2] == head_dim_,
                 "{}: k is {} and v {}, expected {}[m, {}, {}] each", op, describe(k), describe(v),
                 dtype(), kv_heads_, head_dim_);
  check_dtype(op, "k", k, dtype());
  check_dtype(op, "v", v, dtype());
  check_on_device(op, "k", k, k_.device());
  check_on_device(op, "v", v, k_.device());
  MESHTEST_CHECK(row >= 0 && n >= 0 && row + n <= k.shape()[0],
                 "{}: rows [{}, {}) are not within k's {} rows", op, row, row + n, k.shape()[0]);
  MESHTEST_CHECK(first >= 0 && first + n <= max_len_,
                 "{}: positions [{}, {}) are not within [0, {})", op, first, first + n, max_len_);
  if (n == 0) return;
  const std::size_t bytes = k.nbytes() / static_cast<std::size_t>(k.shape()[0]);
  const auto at = [&](std::int64_t i) { return static_cast<std::size_t>(i) * bytes; };
  const DeviceGuard guard(k_.device());
  const auto size = static_cast<std::size_t>(n) * bytes;
  MESHTEST_CUDA_CHECK(cudaMemcpyAsync(k_.bytes() + at(first), k.bytes() + at(row), size,
                                      cudaMemcpyDeviceToDevice, stream));
  MESHTEST_CUDA_CHECK(cudaMemcpyAsync(v_.bytes() + at(first), v.bytes() + at(row), size,
                                      cudaMemcpyDeviceToDevice, stream));
  for (std::int64_t r = first; r < first + n; ++r) written_[static_cast<std::size_t>(r)] = true;
  scope.bytes(static_cast<std::int64_t>(2 * size));
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
