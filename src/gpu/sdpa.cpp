// sdpa (GPU): the CPU op's checks on DeviceTensors, the output, the perf scope and one kernel.
#include "src/gpu/sdpa.hpp"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <vector>

#include "src/gpu/attention_kernel.hpp"
#include "src/gpu/op_timer.hpp"
#include "src/gpu/runtime.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu {

namespace {

/// The checks sdpa_sinks and sdpa_sinks_batch share: q's shape and dtype, the sinks, the window
/// and the scale; returns the scale.
double check_common(std::string_view op, const DeviceTensor& q, const DeviceTensor& sinks,
                    const SdpaOptions& o) {
  MESHTEST_CHECK(q.rank() == 4, "{}: q is {}, expected [Tq, kv_heads, q_per_kv, head_dim]", op,
                 describe(q));
  const std::int64_t kv = q.shape()[1], per = q.shape()[2], d = q.shape()[3];
  MESHTEST_CHECK(d > 0 && d <= detail::kSdpaMaxHeadDim,
                 "{}: head_dim is {}, expected 1 .. {} (a warp's lanes hold the head vector)", op,
                 d, detail::kSdpaMaxHeadDim);
  MESHTEST_CHECK(sinks.shape() == Shape{kv * per}, "{}: sinks are {}, expected [{}] (heads)", op,
                 describe(sinks), kv * per);
  MESHTEST_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16,
                 "{}: q is {}: f32 or bf16 expected", op, describe(q));
  check_dtype(op, "sinks", sinks, q.dtype());
  MESHTEST_CHECK(o.sliding_window >= 0, "{}: sliding_window is {}, expected >= 0", op,
                 o.sliding_window);
  const double scale = o.scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  MESHTEST_CHECK(std::isfinite(scale), "{}: scale is {}, expected a finite value", op, scale);
  return scale;
}

detail::Float float_of(const DeviceTensor& t) {
  return t.dtype() == DType::bf16 ? detail::Float::bf16 : detail::Float::f32;
}

}  // namespace

DeviceTensor sdpa_sinks(const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                        const DeviceTensor& sinks, cudaStream_t stream, const SdpaOptions& o) {
  constexpr std::string_view op = "gpu sdpa_sinks";
  const double scale = check_common(op, q, sinks, o);
  const std::int64_t tq = q.shape()[0], kv = q.shape()[1], per = q.shape()[2], d = q.shape()[3];
  MESHTEST_CHECK(k.rank() == 3 && k.shape()[1] == kv && k.shape()[2] == d,
                 "{}: k is {}, expected [Tk, {}, {}]", op, describe(k), kv, d);
  MESHTEST_CHECK(v.shape() == k.shape(), "{}: v is {}, expected k's shape {}", op, describe(v),
                 k.shape());
  for (const auto& [name, t] : {std::pair{"k", &k}, {"v", &v}})
    check_dtype(op, name, *t, q.dtype());
  const int device = q.empty() ? current_device() : q.device();
  for (const auto& [name, t] : {std::pair{"k", &k}, {"v", &v}, {"sinks", &sinks}}) {
    check_on_device(op, name, *t, device);
  }
  const DeviceGuard guard(device);
  DeviceTensor out(Shape{tq, kv * per * d}, q.dtype(), Tensor::Uninitialized{});
  perf::OpScope scope("sdpa_sinks");
  scope.input(info(q)).input(info(k)).input(info(v)).input(info(sinks));
  scope.attr("window", o.sliding_window).attr("q_offset", o.q_offset).attr("k_offset", o.k_offset);
  time_on_stream(scope, stream);  // last before the launch (see linear)
  const detail::SdpaShape s{.tq = tq,
                            .tk = k.shape()[0],
                            .kv_heads = kv,
                            .q_per_kv = per,
                            .head_dim = d,
                            .q_offset = o.q_offset,
                            .k_offset = o.k_offset,
                            .sliding_window = o.sliding_window,
                            .scale = static_cast<float>(scale)};
  const detail::Float ft = float_of(q);
  if (detail::sdpa_flash_fits(ft, s, q.bytes(), k.bytes(), v.bytes(), out.bytes())) {
    MESHTEST_CUDA_CHECK(detail::launch_sdpa_flash(q.bytes(), k.bytes(), v.bytes(), sinks.bytes(),
                                                  out.bytes(), s, stream));
  } else {
    // The chunks' partials, allocated and freed in the stream's order (a capture records both).
    const std::int64_t chunks = detail::sdpa_chunks(s);
    const auto bytes =
        static_cast<std::size_t>(std::max<std::int64_t>(tq * kv * per * chunks, 1) * (d + 2)) *
        sizeof(float);
    float* partials = nullptr;
    MESHTEST_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partials), bytes, stream));
    const cudaError_t launched =
        detail::launch_sdpa_sinks(ft, q.bytes(), k.bytes(), v.bytes(), sinks.bytes(), out.bytes(),
                                  s, partials, chunks, stream);
    MESHTEST_CUDA_CHECK(cudaFreeAsync(partials, stream));
    MESHTEST_CUDA_CHECK(launched);
  }
  scope.output(info(out)).flops(4.0 * static_cast<double>(tq * kv * per * k.shape()[0] * d));
  return out;
}

DeviceTensor sdpa_sinks_batch(const DeviceTensor& q, std::span<const SdpaSequence> sequences,
                              const DeviceTensor& sinks, cudaStream_t stream,
                              const SdpaOptions& o) {
  constexpr std::string_view op = "gpu sdpa_sinks_batch";
  const double scale = check_common(op, q, sinks, o);
  const std::int64_t tq = q.shape()[0], kv = q.shape()[1], per = q.shape()[2], d = q.shape()[3];
  MESHTEST_CHECK(o.q_offset == 0 && o.k_offset == 0,
                 "{}: q_offset {} and k_offset {} must be 0 (each sequence has its own)", op,
                 o.q_offset, o.k_offset);
  const int device = q.empty() ? current_device() : q.device();
  check_on_device(op, "sinks", sinks, device);
  std::int64_t rows = 0, most_keys = 0;
  double pairs = 0;
  for (std::size_t i = 0; i < sequences.size(); ++i) {
    const SdpaSequence& s = sequences[i];
    MESHTEST_CHECK(s.keys != nullptr && s.values != nullptr,
                   "{}: sequence {} has no keys or values", op, i);
    const DeviceTensor& k = *s.keys;
    MESHTEST_CHECK(k.rank() == 3 && k.shape()[1] == kv && k.shape()[2] == d,
                   "{}: sequence {}'s keys are {}, expected [n, {}, {}]", op, i, describe(k), kv,
                   d);
    MESHTEST_CHECK(s.values->shape() == k.shape(),
                   "{}: sequence {}'s values are {}, expected its keys' shape {}", op, i,
                   describe(*s.values), k.shape());
    check_dtype(op, "keys", k, q.dtype());
    check_dtype(op, "values", *s.values, q.dtype());
    check_on_device(op, "keys", k, device);
    check_on_device(op, "values", *s.values, device);
    MESHTEST_CHECK(0 <= s.key_begin && s.key_begin <= s.key_end && s.key_end <= k.shape()[0],
                   "{}: sequence {}'s keys [{}, {}) are not within its {} rows", op, i, s.key_begin,
                   s.key_end, k.shape()[0]);
    MESHTEST_CHECK(s.rows >= 0, "{}: sequence {} has {} rows, expected >= 0", op, i, s.rows);
    rows += s.rows;
    const std::int64_t n = s.key_end - s.key_begin;
    most_keys = std::max(most_keys, o.sliding_window > 0 ? std::min(n, o.sliding_window) : n);
    pairs += static_cast<double>(s.rows) * static_cast<double>(n);
  }
  MESHTEST_CHECK(rows == tq, "{}: the sequences have {} rows in all, q has {}", op, rows, tq);
  const DeviceGuard guard(device);
  DeviceTensor out(Shape{tq, kv * per * d}, q.dtype(), Tensor::Uninitialized{});
  perf::OpScope scope("sdpa_sinks");
  scope.input(info(q)).input(info(sinks)).attr("window", o.sliding_window);
  scope.attr("sequences", static_cast<std::int64_t>(sequences.size()));
  time_on_stream(scope, stream);  // last before the launches (see linear)
  const detail::SdpaShape shape{.tq = tq,
                                .kv_heads = kv,
                                .q_per_kv = per,
                                .head_dim = d,
                                .sliding_window = o.sliding_window,
                                .scale = static_cast<float>(scale)};
  const detail::Float ft = float_of(q);
  if (detail::sdpa_batch_fits(ft, d, per)) {
    std::vector<detail::SdpaRun> runs;
    std::int64_t row = 0;
    for (const SdpaSequence& s : sequences) {
      const auto element = static_cast<std::size_t>(s.key_begin * kv * d) * dtype_size(q.dtype());
      runs.push_back({.row = row,
                      .rows = s.rows,
                      .q_offset = s.q_offset,
                      .k = s.keys->bytes() + element,
                      .v = s.values->bytes() + element,
                      .tk = s.key_end - s.key_begin,
                      .k_offset = s.k_offset});
      row += s.rows;
    }
    std::int64_t chunk_keys = 0, chunks = 0;
    detail::sdpa_batch_chunks(tq, kv, most_keys, chunk_keys, chunks);
    const auto bytes =
        static_cast<std::size_t>(std::max<std::int64_t>(tq * kv * per * chunks, 1) * (d + 2)) *
        sizeof(float);
    float* partials = nullptr;
    MESHTEST_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partials), bytes, stream));
    cudaError_t launched = cudaSuccess;
    for (std::size_t i = 0; i < runs.size() && launched == cudaSuccess; i += detail::kSdpaBatch) {
      const int n = static_cast<int>(std::min<std::size_t>(detail::kSdpaBatch, runs.size() - i));
      const std::size_t first = static_cast<std::size_t>(runs[i].row * kv * per * chunks) * (d + 2);
      launched = detail::launch_sdpa_batch(ft, q.bytes(), &runs[i], n, sinks.bytes(), out.bytes(),
                                           shape, partials + first, chunk_keys, chunks, stream);
    }
    MESHTEST_CUDA_CHECK(cudaFreeAsync(partials, stream));
    MESHTEST_CUDA_CHECK(launched);
  } else {
    std::int64_t row = 0;
    for (const SdpaSequence& s : sequences) {
      if (s.rows > 0) {
        const DeviceTensor o_s = sdpa_sinks(
            q.slice(0, row, s.rows), s.keys->slice(0, s.key_begin, s.key_end - s.key_begin),
            s.values->slice(0, s.key_begin, s.key_end - s.key_begin), sinks, stream,
            {.sliding_window = o.sliding_window,
             .q_offset = s.q_offset,
             .k_offset = s.k_offset,
             .scale = o.scale});
        MESHTEST_CUDA_CHECK(cudaStreamSynchronize(stream));  // o_s complete for the copy
        out.assign_slice(0, row, o_s);
      }
      row += s.rows;
    }
  }
  scope.output(info(out)).flops(4.0 * pairs * static_cast<double>(kv * per * d));
  return out;
}

}  // namespace meshtest::gpu
