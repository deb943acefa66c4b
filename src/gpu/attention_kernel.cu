// attention_kernel: scaled-dot-product attention with sinks, causal and sliding-window masks
// and GQA, flash-style: one warp per query row and head, f32 and bf16 (as bits).
#include "src/gpu/attention_kernel.hpp"

#include "src/gpu/bf16_device.cuh"

#include <cstdint>

namespace meshtest::gpu::detail {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kPerLane = static_cast<int>(kSdpaMaxHeadDim / kWarp);

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Lane l holds elements l, l + 32, ... of the head vector (those below head_dim).
template <class S>
__global__ void sdpa_sinks_kernel(const S* q, const S* k, const S* v, const S* sinks, S* out,
                                  SdpaShape s) {
  const std::int64_t heads = s.kv_heads * s.q_per_kv, d = s.head_dim;
  const std::int64_t warp =
      blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  if (warp >= s.tq * heads) return;  // the whole warp leaves together
  const std::int64_t row = warp / heads, h = warp % heads, g = h / s.q_per_kv;
  const int per_lane = static_cast<int>((d + kWarp - 1) / kWarp);
  float qv[kPerLane], acc[kPerLane];
  const S* qr = q + (row * heads + h) * d;  // q's [kv, q_per_kv] heads are h = g q_per_kv + m
  for (int e = 0; e < per_lane; ++e) {
    const std::int64_t at = lane + e * kWarp;
    qv[e] = at < d ? load(qr, at) : 0.0f;
    acc[e] = 0;
  }
  const float sink = load(sinks, h);
  float m = sink;                             // the running max, started at the sink's logit
  float l = isinf(sink) && sink < 0 ? 0 : 1;  // its exp(sink - m) = 1, none for a -inf sink
  const std::int64_t qp = s.q_offset + row;
  std::int64_t first = 0, last = qp - s.k_offset;  // keys j with k_offset + j <= qp
  if (s.sliding_window > 0) {
    const std::int64_t lo = qp - s.sliding_window + 1 - s.k_offset;
    first = lo > 0 ? lo : 0;
  }
  if (last > s.tk - 1) last = s.tk - 1;
  for (std::int64_t j = first; j <= last; ++j) {
    const S* kr = k + (j * s.kv_heads + g) * d;
    float part = 0;
    for (int e = 0; e < per_lane; ++e) {
      const std::int64_t at = lane + e * kWarp;
      if (at < d) part += qv[e] * load(kr, at);
    }
    const float logit = warp_sum(part) * s.scale;
    const float m_new = logit > m ? logit : m;
    const float correction = isinf(m) && m < 0 ? 0.0f : expf(m - m_new);
    const float p = expf(logit - m_new);
    l = l * correction + p;
    const S* vr = v + (j * s.kv_heads + g) * d;
    for (int e = 0; e < per_lane; ++e) {
      const std::int64_t at = lane + e * kWarp;
      acc[e] = acc[e] * correction + (at < d ? p * load(vr, at) : 0.0f);
    }
    m = m_new;
  }
  S* o = out + (row * heads + h) * d;
  for (int e = 0; e < per_lane; ++e) {
    const std::int64_t at = lane + e * kWarp;
    if (at < d) store(o, at, l > 0 ? acc[e] / l : 0.0f);
  }
}

}  // namespace

cudaError_t launch_sdpa_sinks(Float t, const void* q, const void* k, const void* v,
                              const void* sinks, void* out, const SdpaShape& s,
                              cudaStream_t stream) {
  const std::int64_t warps = s.tq * s.kv_heads * s.q_per_kv;
  if (warps == 0 || s.head_dim == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (t == Float::bf16) {
    using B = std::uint16_t;
    sdpa_sinks_kernel<<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(
        static_cast<const B*>(q), static_cast<const B*>(k), static_cast<const B*>(v),
        static_cast<const B*>(sinks), static_cast<B*>(out), s);
  } else {
    sdpa_sinks_kernel<<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(
        static_cast<const float*>(q), static_cast<const float*>(k), static_cast<const float*>(v),
        static_cast<const float*>(sinks), static_cast<float*>(out), s);
  }
  return cudaGetLastError();
}

}  // namespace meshtest::gpu::detail
