// attention_kernel: scaled-dot-product attention with sinks, causal and sliding-window masks
// and GQA, flash-style and split over the keys: a warp per query row, head and chunk of keys,
// then a warp per row and head merging the chunks, f32 and bf16 (as bits).
#include "src/gpu/attention_kernel.hpp"

#include "src/gpu/bf16_device.cuh"

#include <cstdint>

namespace meshtest::gpu::detail {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kPerLane = static_cast<int>(kSdpaMaxHeadDim / kWarp);

constexpr float kMinusInf = -__builtin_huge_valf();

/// The keys [first, last] query row `row` sees (empty when first > last).
__device__ __forceinline__ void keys_of(const SdpaShape& s, std::int64_t row, std::int64_t& first,
                                        std::int64_t& last) {
  const std::int64_t qp = s.q_offset + row;
  first = 0;
  last = qp - s.k_offset;  // keys j with k_offset + j <= qp
  if (s.sliding_window > 0) {
    const std::int64_t lo = qp - s.sliding_window + 1 - s.k_offset;
    first = lo > 0 ? lo : 0;
  }
  if (last > s.tk - 1) last = s.tk - 1;
}

// One warp per (query row, head, chunk of the row's keys): the chunk's running max m, softmax
// denominator l and unnormalized output acc, into part [rows heads, chunks, d + 2] (acc, then m
// and l). Lane l holds elements l, l + 32, ... of the head vectors; each key's q·k is the lanes'
// partial products summed by shuffles, four keys at a time (their loads and shuffles
// interleaved), then the online softmax takes them in key order.
template <class S>
__global__ void sdpa_partial_kernel(const S* q, const S* k, const S* v, SdpaShape s,
                                    std::int64_t chunks, std::int64_t chunk_keys, float* part) {
  constexpr int kGroup = 4;
  const std::int64_t heads = s.kv_heads * s.q_per_kv, d = s.head_dim;
  const std::int64_t warp =
      blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  if (warp >= s.tq * heads * chunks) return;  // the whole warp leaves together
  const std::int64_t rh = warp / chunks, c = warp % chunks;
  const std::int64_t row = rh / heads, h = rh % heads, g = h / s.q_per_kv;
  const int per_lane = static_cast<int>((d + kWarp - 1) / kWarp);
  const S* qr = q + (row * heads + h) * d;  // q's [kv, q_per_kv] heads are h = g q_per_kv + m
  float qv[kPerLane], acc[kPerLane];
  for (int e = 0; e < per_lane; ++e) {
    const std::int64_t at = lane + e * kWarp;
    qv[e] = at < d ? load(qr, at) : 0.0f;
    acc[e] = 0;
  }
  std::int64_t first = 0, last = -1;
  keys_of(s, row, first, last);
  const std::int64_t lo = first + c * chunk_keys;
  const std::int64_t hi = last < lo + chunk_keys - 1 ? last : lo + chunk_keys - 1;
  float m = kMinusInf, l = 0;
  for (std::int64_t j0 = lo; j0 <= hi; j0 += kGroup) {
    const int n = hi - j0 + 1 < kGroup ? static_cast<int>(hi - j0 + 1) : kGroup;
    float logit[kGroup];
    for (int u = 0; u < kGroup; ++u) {
      float part_dot = 0;
      if (u < n) {
        const S* kr = k + ((j0 + u) * s.kv_heads + g) * d;
        for (int e = 0; e < per_lane; ++e) {
          const std::int64_t at = lane + e * kWarp;
          if (at < d) part_dot += qv[e] * load(kr, at);
        }
      }
      logit[u] = part_dot;
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      for (int u = 0; u < kGroup; ++u) logit[u] += __shfl_xor_sync(0xffffffffu, logit[u], offset);
    }
    for (int u = 0; u < n; ++u) {
      const float x = logit[u] * s.scale;
      const float m_new = x > m ? x : m;
      const float correction = m == kMinusInf ? 0.0f : expf(m - m_new);
      const float p = expf(x - m_new);
      l = l * correction + p;
      const S* vr = v + ((j0 + u) * s.kv_heads + g) * d;
      for (int e = 0; e < per_lane; ++e) {
        const std::int64_t at = lane + e * kWarp;
        acc[e] = acc[e] * correction + (at < d ? p * load(vr, at) : 0.0f);
      }
      m = m_new;
    }
  }
  float* pr = part + warp * (d + 2);
  for (int e = 0; e < per_lane; ++e) {
    const std::int64_t at = lane + e * kWarp;
    if (at < d) pr[at] = acc[e];
  }
  if (lane == 0) pr[d] = m, pr[d + 1] = l;
}

// One warp per (query row, head): the chunks' partials merged with the sink (the running max
// started at the sink's logit, its exp joining the denominator only; none for a -inf sink),
// the output rounded once to the stored type; zeros for a row with no key and a -inf sink.
template <class S>
__global__ void sdpa_combine_kernel(const float* part, const S* sinks, S* out, SdpaShape s,
                                    std::int64_t chunks) {
  const std::int64_t heads = s.kv_heads * s.q_per_kv, d = s.head_dim;
  const std::int64_t warp =
      blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  if (warp >= s.tq * heads) return;
  const std::int64_t h = warp % heads;
  const int per_lane = static_cast<int>((d + kWarp - 1) / kWarp);
  const float sink = load(sinks, h);
  const bool sink_counts = !(isinf(sink) && sink < 0);
  float big = sink_counts ? sink : kMinusInf;
  const float* pr = part + warp * chunks * (d + 2);
  for (std::int64_t c = 0; c < chunks; ++c) {
    const float mc = pr[c * (d + 2) + d], lc = pr[c * (d + 2) + d + 1];
    if (lc > 0 && mc > big) big = mc;
  }
  float l = sink_counts ? expf(sink - big) : 0.0f;
  float acc[kPerLane];
  for (int e = 0; e < per_lane; ++e) acc[e] = 0;
  for (std::int64_t c = 0; c < chunks; ++c) {
    const float mc = pr[c * (d + 2) + d], lc = pr[c * (d + 2) + d + 1];
    if (!(lc > 0)) continue;
    const float scale = expf(mc - big);
    l += lc * scale;
    for (int e = 0; e < per_lane; ++e) {
      const std::int64_t at = lane + e * kWarp;
      if (at < d) acc[e] += pr[c * (d + 2) + at] * scale;
    }
  }
  S* o = out + warp * d;
  for (int e = 0; e < per_lane; ++e) {
    const std::int64_t at = lane + e * kWarp;
    if (at < d) store(o, at, l > 0 ? acc[e] / l : 0.0f);
  }
}

}  // namespace

std::int64_t sdpa_chunks(const SdpaShape& s) {
  const std::int64_t rows = s.tq * s.kv_heads * s.q_per_kv;
  if (rows == 0) return 1;
  const std::int64_t keys =
      s.sliding_window > 0 && s.sliding_window < s.tk ? s.sliding_window : s.tk;
  // Enough warps to fill the GPU (about 64 Ki), chunks of at least 64 keys.
  const std::int64_t want = (65536 + rows - 1) / rows;
  const std::int64_t most = (keys + 63) / 64;
  return want < 1 ? 1 : (want < most ? want : (most < 1 ? 1 : most));
}

cudaError_t launch_sdpa_sinks(Float t, const void* q, const void* k, const void* v,
                              const void* sinks, void* out, const SdpaShape& s, float* partials,
                              std::int64_t chunks, cudaStream_t stream) {
  const std::int64_t warps = s.tq * s.kv_heads * s.q_per_kv;
  if (warps == 0 || s.head_dim == 0) return cudaSuccess;
  const std::int64_t keys =
      s.sliding_window > 0 && s.sliding_window < s.tk ? s.sliding_window : s.tk;
  const std::int64_t chunk_keys =
      (keys + chunks - 1) / chunks > 0 ? (keys + chunks - 1) / chunks : 1;
  const auto part_blocks =
      static_cast<unsigned>((warps * chunks + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const auto blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const auto run = [&](auto tag) {
    using S = decltype(tag);
    sdpa_partial_kernel<<<part_blocks, kWarpsPerBlock * kWarp, 0, stream>>>(
        static_cast<const S*>(q), static_cast<const S*>(k), static_cast<const S*>(v), s, chunks,
        chunk_keys, partials);
    sdpa_combine_kernel<<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(
        partials, static_cast<const S*>(sinks), static_cast<S*>(out), s, chunks);
  };
  if (t == Float::bf16) {
    run(std::uint16_t{});
  } else {
    run(float{});
  }
  return cudaGetLastError();
}

}  // namespace meshtest::gpu::detail
