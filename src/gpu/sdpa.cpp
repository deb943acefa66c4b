// sdpa (GPU): the CPU op's checks on DeviceTensors, the output, the perf scope and one kernel.
#include "src/gpu/sdpa.hpp"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "src/gpu/attention_kernel.hpp"
#include "src/gpu/op_timer.hpp"
#include "src/gpu/runtime.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu {

DeviceTensor sdpa_sinks(const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                        const DeviceTensor& sinks, cudaStream_t stream, const SdpaOptions& o) {
  constexpr std::string_view op = "gpu sdpa_sinks";
  MESHTEST_CHECK(q.rank() == 4, "{}: q is {}, expected [Tq, kv_heads, q_per_kv, head_dim]", op,
                 describe(q));
  const std::int64_t tq = q.shape()[0], kv = q.shape()[1], per = q.shape()[2], d = q.shape()[3];
  MESHTEST_CHECK(d > 0 && d <= detail::kSdpaMaxHeadDim,
                 "{}: head_dim is {}, expected 1 .. {} (a warp's lanes hold the head vector)", op,
                 d, detail::kSdpaMaxHeadDim);
  MESHTEST_CHECK(k.rank() == 3 && k.shape()[1] == kv && k.shape()[2] == d,
                 "{}: k is {}, expected [Tk, {}, {}]", op, describe(k), kv, d);
  MESHTEST_CHECK(v.shape() == k.shape(), "{}: v is {}, expected k's shape {}", op, describe(v),
                 k.shape());
  MESHTEST_CHECK(sinks.shape() == Shape{kv * per}, "{}: sinks are {}, expected [{}] (heads)", op,
                 describe(sinks), kv * per);
  MESHTEST_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16,
                 "{}: q is {}: f32 or bf16 expected", op, describe(q));
  for (const auto& [name, t] : {std::pair{"k", &k}, {"v", &v}, {"sinks", &sinks}}) {
    check_dtype(op, name, *t, q.dtype());
  }
  MESHTEST_CHECK(o.sliding_window >= 0, "{}: sliding_window is {}, expected >= 0", op,
                 o.sliding_window);
  const double scale = o.scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  MESHTEST_CHECK(std::isfinite(scale), "{}: scale is {}, expected a finite value", op, scale);
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
  // The chunks' partials, allocated and freed in the stream's order (a capture records both).
  const std::int64_t chunks = detail::sdpa_chunks(s);
  const auto bytes =
      static_cast<std::size_t>(std::max<std::int64_t>(tq * kv * per * chunks, 1) * (d + 2)) *
      sizeof(float);
  float* partials = nullptr;
  MESHTEST_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partials), bytes, stream));
  const cudaError_t launched = detail::launch_sdpa_sinks(
      q.dtype() == DType::bf16 ? detail::Float::bf16 : detail::Float::f32, q.bytes(), k.bytes(),
      v.bytes(), sinks.bytes(), out.bytes(), s, partials, chunks, stream);
  MESHTEST_CUDA_CHECK(cudaFreeAsync(partials, stream));
  MESHTEST_CUDA_CHECK(launched);
  scope.output(info(out)).flops(4.0 * static_cast<double>(tq * kv * per * k.shape()[0] * d));
  return out;
}

}  // namespace meshtest::gpu
