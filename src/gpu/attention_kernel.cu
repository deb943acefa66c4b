// attention_kernel: scaled-dot-product attention with sinks, causal and sliding-window masks
// and GQA, flash-style and split over the keys: a warp per query row, head and chunk of keys,
// then a warp per row and head merging the chunks, f32 and bf16 (as bits).
#include "src/gpu/attention_kernel.hpp"

#include "src/gpu/attention_keys.cuh"
#include "src/gpu/bf16_device.cuh"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace meshtest::gpu::detail {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kPerLane = static_cast<int>(kSdpaMaxHeadDim / kWarp);

constexpr float kMinusInf = -__builtin_huge_valf();

/// The keys [first, last] query row `row` sees (empty when first > last).
__device__ __forceinline__ void keys_of(const SdpaShape& s, std::int64_t row, std::int64_t& first,
                                        std::int64_t& last) {
  keys_seen(s.q_offset + row, s.k_offset, s.tk, s.sliding_window, first, last);
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
// the output rounded once to the stored type; zeros for a row with no key and a -inf sink. The
// chunks' maxima and sums are read 32 at a time, a lane a chunk, then added in chunk order.
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
  for (std::int64_t c = lane; c < chunks; c += kWarp) {
    const float mc = pr[c * (d + 2) + d], lc = pr[c * (d + 2) + d + 1];
    if (lc > 0 && mc > big) big = mc;
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, offset));
  }
  float l = sink_counts ? expf(sink - big) : 0.0f;
  float acc[kPerLane];
  for (int e = 0; e < per_lane; ++e) acc[e] = 0;
  for (std::int64_t c0 = 0; c0 < chunks; c0 += kWarp) {
    const std::int64_t mine = c0 + lane;
    float my_l = 0, my_scale = 0;
    if (mine < chunks) {
      my_l = pr[mine * (d + 2) + d + 1];
      if (my_l > 0) my_scale = expf(pr[mine * (d + 2) + d] - big);
    }
    const int n = chunks - c0 < kWarp ? static_cast<int>(chunks - c0) : kWarp;
    // No branch on the chunk: an empty one (its values never written) adds 0 x 0 = +0, which
    // leaves every sum's bits as they are, and the loads of several chunks are in flight at once.
#pragma unroll 4
    for (int j = 0; j < n; ++j) {
      const float lc = __shfl_sync(0xffffffffu, my_l, j);
      const float scale = __shfl_sync(0xffffffffu, my_scale, j);
      const bool counts = lc > 0;
      l += (counts ? lc : 0.0f) * scale;
      const float* pc = pr + (c0 + j) * (d + 2);
      for (int e = 0; e < per_lane; ++e) {
        const std::int64_t at = lane + e * kWarp;
        if (at < d) acc[e] += (counts ? pc[at] : 0.0f) * scale;
      }
    }
  }
  S* o = out + warp * d;
  for (int e = 0; e < per_lane; ++e) {
    const std::int64_t at = lane + e * kWarp;
    if (at < d) store(o, at, l > 0 ? acc[e] / l : 0.0f);
  }
}

// One block per (query row, kv head g, chunk of the row's keys) of a batch of sequences: the
// kv head's q_per_kv query vectors in shared memory (f32), then (1) a thread per key reading
// its row 16 bytes at a time and dotting it with every query (the queries' elements broadcast
// from shared memory), the scaled scores kept there; (2) a warp per query head: the chunk's
// max, its weights and their sum; (3) a thread per pair of elements and a few heads (kD / 2
// threads cover a value row, so a warp reads whole rows), the weighted sum of the chunk's
// values. Into part [rows heads, chunks, d + 2] as sdpa_partial_kernel's.
template <class S, int kD>
__global__ void __launch_bounds__(128)
    sdpa_batch_partial_kernel(const S* q, const __grid_constant__ SdpaBatch b, SdpaShape s,
                              std::int64_t chunk_keys, std::int64_t chunks, float* part) {
  constexpr int kThreads = 128, kE = 16 / static_cast<int>(sizeof(S)), kMaxPer = 16;
  constexpr int kParts = kD / kE, kSlots = kThreads / kParts;  // threads a row, rows at once
  extern __shared__ __align__(16) float smem[];
  const int per = static_cast<int>(s.q_per_kv);
  const std::int64_t heads = s.kv_heads * per;
  float* qs = smem;  // [per][kD], later [kSlots][8][kD]
  float* sc = smem + (kSlots * 8 * kD > per * kD ? kSlots * 8 * kD : per * kD);  // [keys][per]
  const std::int64_t row = blockIdx.x / chunks, c = blockIdx.x % chunks, g = blockIdx.y;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarp, warp = tid / kWarp;
  // The row's sequence and its keys [lo, lo + nk).
  const std::int64_t qrow = b.seq[0].row + row;
  std::int64_t lo = 0, hi = -1;
  const SdpaRun& r = batch_chunk(b, row, c, chunk_keys, s.sliding_window, lo, hi);
  float* pr = part + ((row * heads + g * per) * chunks + c) * (kD + 2);
  const std::int64_t pstride = chunks * (kD + 2);  // one query head to the next
  const int nk = hi >= lo ? static_cast<int>(hi - lo + 1) : 0;
  if (nk == 0) {  // a chunk past the row's keys: empty (the whole block leaves together)
    for (int m = tid; m < per; m += kThreads) pr[m * pstride + kD + 1] = 0;
    return;
  }
  const S* qg = q + (qrow * heads + g * per) * kD;
  for (int x = tid; x < per * kD; x += kThreads) qs[x] = load(qg, x);
  __syncthreads();
  // (1) scores: a thread per key, its row 16 bytes at a time, the queries' elements read four
  // at a time (the same address across the warp: a broadcast).
  const std::int64_t stride = s.kv_heads * kD;
  const S* kg = static_cast<const S*>(r.k) + g * kD + lo * stride;
  for (int j = tid; j < nk; j += kThreads) {
    float dot[kMaxPer];
    for (int m = 0; m < kMaxPer; ++m) dot[m] = 0;
    const S* kr = kg + j * stride;
    // Every load of the row in flight at once up to 8 of them (gpt-oss's 64 bf16: 8), fewer
    // for wider rows (their instantiations' compile time).
    constexpr int kUnroll = kD / kE <= 8 ? kD / kE : 2;
#pragma unroll kUnroll
    for (int e0 = 0; e0 < kD; e0 += kE) {
      const uint4 w = *reinterpret_cast<const uint4*>(kr + e0);
      const S* piece = reinterpret_cast<const S*>(&w);
      float kf[kE];
      for (int x = 0; x < kE; ++x) kf[x] = load(piece, x);
      for (int m = 0; m < kMaxPer; ++m) {
        if (m < per) {
          for (int x = 0; x < kE; x += 4) {
            const float4 qv = *reinterpret_cast<const float4*>(qs + m * kD + e0 + x);
            dot[m] += kf[x] * qv.x + kf[x + 1] * qv.y + kf[x + 2] * qv.z + kf[x + 3] * qv.w;
          }
        }
      }
    }
    for (int m = 0; m < kMaxPer; ++m) {
      if (m < per) sc[j * per + m] = dot[m] * s.scale;
    }
  }
  __syncthreads();
  // (2) each query head's max, weights and their sum over the chunk (scores [key][head]).
  for (int m = warp; m < per; m += kThreads / kWarp) {
    float big = kMinusInf;
    for (int j = lane; j < nk; j += kWarp) big = fmaxf(big, sc[j * per + m]);
    for (int off = kWarp / 2; off > 0; off /= 2) {
      big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, off));
    }
    float sum = 0;
    for (int j = lane; j < nk; j += kWarp) {
      const float p = expf(sc[j * per + m] - big);
      sc[j * per + m] = p;
      sum += p;
    }
    for (int off = kWarp / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) pr[m * pstride + kD] = big, pr[m * pstride + kD + 1] = sum;
  }
  __syncthreads();
  // (3) the weighted values, eight heads at a time: a thread per 16 bytes of a value row and slot
  // of keys (keys j = slot, slot + kSlots, ...: each row read once a pass, a warp reading whole
  // rows), then the slots' sums added in shared memory (over the queries, no longer read).
  const int piece = tid % kParts, slot = tid / kParts;
  const S* vg = static_cast<const S*>(r.v) + g * kD + lo * stride + piece * kE;
  float* red = qs;  // [kSlots][8][kD]
  for (int m0 = 0; m0 < per; m0 += 8) {
    const int heads_now = per - m0 < 8 ? per - m0 : 8;
    float acc[8][kE];
    for (auto& a : acc) {
      for (float& x : a) x = 0;
    }
#pragma unroll 4
    for (int j = slot; j < nk; j += kSlots) {
      const uint4 w = *reinterpret_cast<const uint4*>(vg + j * stride);
      const S* vs = reinterpret_cast<const S*>(&w);
      float vf[kE];
      for (int x = 0; x < kE; ++x) vf[x] = load(vs, x);
      const float* p = sc + j * per + m0;
      for (int m = 0; m < 8; ++m) {
        if (m < heads_now) {
          for (int x = 0; x < kE; ++x) acc[m][x] += p[m] * vf[x];
        }
      }
    }
    __syncthreads();  // the queries (pass 0) or the last pass's sums read
    for (int m = 0; m < heads_now; ++m) {
      for (int x = 0; x < kE; ++x) red[(slot * 8 + m) * kD + piece * kE + x] = acc[m][x];
    }
    __syncthreads();
    for (int x = tid; x < heads_now * kD; x += kThreads) {
      float sum = 0;
      for (int sl = 0; sl < kSlots; ++sl) sum += red[sl * 8 * kD + x];
      pr[(m0 + x / kD) * pstride + x % kD] = sum;
    }
  }
}

}  // namespace

bool sdpa_batch_fits(Float, std::int64_t head_dim, std::int64_t q_per_kv) {
  const bool size = head_dim == 8 || head_dim == 16 || head_dim == 32 || head_dim == 64 ||
                    head_dim == 128 || head_dim == 256;
  return size && q_per_kv >= 1 && q_per_kv <= 16;
}

void sdpa_batch_chunks(std::int64_t rows, std::int64_t kv_heads, std::int64_t most_keys,
                       std::int64_t& chunk_keys, std::int64_t& chunks) {
  const std::int64_t keys = most_keys > 1 ? most_keys : 1;
  chunk_keys = 256;
  while (chunk_keys > 64 && rows * kv_heads * ((keys + chunk_keys - 1) / chunk_keys) < 2048) {
    chunk_keys /= 2;
  }
  chunks = (keys + chunk_keys - 1) / chunk_keys;
}

cudaError_t launch_sdpa_batch(Float t, const void* q, const SdpaRun* seq, int n, const void* sinks,
                              void* out, const SdpaShape& s, float* partials,
                              std::int64_t chunk_keys, std::int64_t chunks, cudaStream_t stream) {
  if (n <= 0 || n > kSdpaBatch) return cudaErrorInvalidValue;
  SdpaBatch b{};
  for (int i = 0; i < n; ++i) b.seq[i] = seq[i];
  b.n = n;
  const std::int64_t rows = seq[n - 1].row + seq[n - 1].rows - seq[0].row;
  const std::int64_t heads = s.kv_heads * s.q_per_kv, d = s.head_dim;
  if (rows == 0 || heads == 0) return cudaSuccess;
  // The kernel's shared memory: [kSlots][8][d] sums (the queries before), [chunk_keys][per] scores.
  const std::int64_t parts = d * (t == Float::bf16 ? 2 : 4) / 16, slots = 128 / parts;
  const auto smem =
      static_cast<std::size_t>(std::max(slots * 8 * d, s.q_per_kv * d) + chunk_keys * s.q_per_kv) *
      sizeof(float);
  const dim3 grid(static_cast<unsigned>(rows * chunks), static_cast<unsigned>(s.kv_heads));
  SdpaShape merged = s;
  merged.tq = rows;
  const auto blocks = static_cast<unsigned>((rows * heads + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const auto run = [&](auto tag, auto dim) {
    using S = decltype(tag);
    constexpr int kD = decltype(dim)::value;
    const cudaError_t sized =
        cudaFuncSetAttribute(sdpa_batch_partial_kernel<S, kD>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (sized != cudaSuccess) return;  // cudaGetLastError reports it
    sdpa_batch_partial_kernel<S, kD>
        <<<grid, 128, smem, stream>>>(static_cast<const S*>(q), b, s, chunk_keys, chunks, partials);
    sdpa_combine_kernel<<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(
        partials, static_cast<const S*>(sinks), static_cast<S*>(out) + seq[0].row * heads * d,
        merged, chunks);
  };
  if (sdpa_batch_flash_fits(t, d, s.q_per_kv)) {
    const cudaError_t launched =
        launch_sdpa_batch_flash(q, b, s, partials, rows, chunk_keys, chunks, stream);
    if (launched != cudaSuccess) return launched;
    sdpa_combine_kernel<<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(
        partials, static_cast<const std::uint16_t*>(sinks),
        static_cast<std::uint16_t*>(out) + seq[0].row * heads * d, merged, chunks);
    return cudaGetLastError();
  }
  const auto with_dim = [&](auto tag) {
    switch (d) {
      case 8:
        return run(tag, std::integral_constant<int, 8>{});
      case 16:
        return run(tag, std::integral_constant<int, 16>{});
      case 32:
        return run(tag, std::integral_constant<int, 32>{});
      case 64:
        return run(tag, std::integral_constant<int, 64>{});
      case 128:
        return run(tag, std::integral_constant<int, 128>{});
      default:
        return run(tag, std::integral_constant<int, 256>{});
    }
  };
  if (t == Float::bf16) {
    with_dim(std::uint16_t{});
  } else {
    with_dim(float{});
  }
  return cudaGetLastError();
}

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
