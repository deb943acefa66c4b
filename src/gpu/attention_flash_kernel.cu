// attention_flash_kernel: sdpa_sinks in bf16 on tensor cores, flash-style. Scores q·kᵀ and the
// weighted values p·v are mma.sync m16n8k16 (bf16 in, f32 sums) on fragments read by ldmatrix
// from shared memory, the keys and values staged there by cp.async.
// - Prefill (launch_sdpa_flash): a block of four warps per 64 query rows and H heads of one kv
//   group (H = 2 where it can: each key and value fragment read from shared memory feeds both
//   heads' products), each warp 16 rows of every head, over the keys in tiles of 64,
//   double-buffered; only the tiles that cut a row's key range are masked.
// - Decode (launch_sdpa_batch_flash): a block of one warp per query row, kv head and chunk of
//   keys; the kv head's queries are the 16 rows of one tile (zeros past q_per_kv), the chunk's
//   keys and values in tiles of 64, double-buffered, into the split-key kernel's partials. Small
//   blocks, many to a multiprocessor, keep its loads in flight while others compute.
#include "src/gpu/attention_kernel.hpp"

#include <cuda_runtime.h>

#include <cstdint>

#include "src/gpu/attention_keys.cuh"

namespace meshtest::gpu::detail {
namespace {

constexpr int kRows = 64;        // query rows per prefill block (16 per warp)
constexpr int kKeys = 64;        // keys per prefill tile
constexpr int kDecodeKeys = 32;  // keys per decode tile: small blocks, many to a multiprocessor
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kMinusInf = -__builtin_huge_valf();

// Shared memory holds tiles of [rows][D] bf16 with each row's 16-byte chunks permuted by the
// row's low three bits (chunk c at c ^ (row & 7)): the 8 rows an ldmatrix reads, and the rows
// cp.async writes, then fall in different banks.
template <int D>
__device__ __forceinline__ int swizzled(int row, int col) {
  return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory, asynchronous; zeros when `valid` is false.
__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copies_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void copies_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

// c += a b for one m16n8k16 tile: a 16x16 (row), b 16x8 (col), bf16; c 16x8 f32.
__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                    unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two f32 as bf16 (rounded to nearest even) in one register, lo in the low half.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// 2^x by the special-function unit (ex2.approx: 2 ulp; 2^-inf = 0).
__device__ __forceinline__ float exp2_fast(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float bf16_to_float(std::uint16_t b) {
  return __uint_as_float(static_cast<unsigned>(b) << 16);
}

// The keys [first, last] of query row `row` (empty when first > last).
__device__ __forceinline__ void key_range(const SdpaShape& s, std::int64_t row, std::int64_t& first,
                                          std::int64_t& last) {
  keys_seen(s.q_offset + row, s.k_offset, s.tk, s.sliding_window, first, last);
}

// Loads rows [row0, row0 + N) of a [rows, stride] bf16 matrix (row r at base + r * stride) into a
// swizzled tile, thread `t` of `threads` taking every threads-th 16 bytes; rows at or past `rows`
// (and below 0) read as zeros.
template <int D, int N>
__device__ __forceinline__ void load_tile(std::uint16_t* tile, const std::uint16_t* base,
                                          std::int64_t stride, std::int64_t row0, std::int64_t rows,
                                          int t, int threads) {
  constexpr int kChunks = D / 8;  // 16-byte chunks a row
  for (int i = t; i < N * kChunks; i += threads) {
    const int r = i / kChunks, c = i % kChunks;
    const std::int64_t g = row0 + r;
    const bool valid = g >= 0 && g < rows;
    copy16(tile + swizzled<D>(r, c * 8), base + (valid ? g : 0) * stride + c * 8, valid);
  }
}

// sc[h] += q[h] kᵀ for H heads' 16 rows against a tile of K keys: K / 8 n-tiles of 8 keys, each
// key fragment read once for all H. Head h's queries are rows [row, row + 16) of the swizzled
// [rows][D] tile at q + h * q_stride, read by ldmatrix as they are used (not held in registers:
// the registers go to more warps a multiprocessor).
template <int D, int H, int K>
__device__ __forceinline__ void scores(float (&sc)[H][K / 8][4], const std::uint16_t* q,
                                       int q_stride, int row, const std::uint16_t* kt, int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned qa[H][4];
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const int r = row + (lane % 8) + 8 * ((lane / 8) % 2), c = kk * 16 + 8 * (lane / 16);
      ldmatrix_x4(qa[h], q + h * q_stride + swizzled<D>(r, c));
    }
#pragma unroll
    for (int np = 0; np < K / 16; ++np) {
      unsigned b[4];
      const int r = np * 16 + (lane % 8) + 8 * (lane / 16), c = kk * 16 + 8 * ((lane / 8) % 2);
      ldmatrix_x4(b, kt + swizzled<D>(r, c));
#pragma unroll
      for (int h = 0; h < H; ++h) {
        mma(sc[h][2 * np], qa[h], b[0], b[1]);
        mma(sc[h][2 * np + 1], qa[h], b[2], b[3]);
      }
    }
  }
}

// The online softmax of one tile of K keys for each of the thread's two rows (quad and quad + 8
// of its warp's 16; sc's elements 0-1 and 2-3), scores masked (-inf) and to be multiplied by
// `scale` > 0 (to base 2; the multiply folded into the exponent's argument, one fma): the running
// max m (scaled) and sum l updated, the accumulator o rescaled (skipped where no row's max of the
// warp moved: a factor of exactly 1), sc replaced by the weights.
template <int D, int K>
__device__ __forceinline__ void softmax_tile(float (&sc)[K / 8][4], float (&m)[2], float (&l)[2],
                                             float (&o)[D / 8][4], float scale) {
  float correction[2];
  bool moved = false;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float tile_max = kMinusInf;
#pragma unroll
    for (int n = 0; n < K / 8; ++n) {
      tile_max = fmaxf(tile_max, fmaxf(sc[n][2 * i], sc[n][2 * i + 1]));
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float m_new = fmaxf(m[i], tile_max * scale);
    const float base = m_new == kMinusInf ? 0.0f : m_new;  // a row with no key yet
    moved = moved || m_new != m[i];
    correction[i] = m_new != m[i] ? exp2_fast(m[i] - base) : 1.0f;
    m[i] = m_new;
    float sum = 0;
#pragma unroll
    for (int n = 0; n < K / 8; ++n) {
#pragma unroll
      for (int e = 2 * i; e < 2 * i + 2; ++e) {
        sc[n][e] = exp2_fast(fmaf(sc[n][e], scale, -base));
        sum += sc[n][e];
      }
    }
    l[i] = l[i] * correction[i] + sum;
  }
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (auto& t : o) {
      t[0] *= correction[0], t[1] *= correction[0];
      t[2] *= correction[1], t[3] *= correction[1];
    }
  }
}

// o[h] += p[h] v for H heads' weights over a tile of K keys (the scores' accumulator tiles are
// the A fragments of p, rounded to bf16), each value fragment read once for all H.
template <int D, int H, int K>
__device__ __forceinline__ void weighted_values(float (&o)[H][D / 8][4],
                                                const float (&p)[H][K / 8][4],
                                                const std::uint16_t* vt, int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    unsigned pa[H][4];
#pragma unroll
    for (int h = 0; h < H; ++h) {
      pa[h][0] = pack_bf16(p[h][2 * kk][0], p[h][2 * kk][1]);
      pa[h][1] = pack_bf16(p[h][2 * kk][2], p[h][2 * kk][3]);
      pa[h][2] = pack_bf16(p[h][2 * kk + 1][0], p[h][2 * kk + 1][1]);
      pa[h][3] = pack_bf16(p[h][2 * kk + 1][2], p[h][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      unsigned b[4];
      const int r = kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2), c = dp * 16 + 8 * (lane / 16);
      ldmatrix_x4_trans(b, vt + swizzled<D>(r, c));
#pragma unroll
      for (int h = 0; h < H; ++h) {
        mma(o[h][2 * dp], pa[h], b[0], b[1]);
        mma(o[h][2 * dp + 1], pa[h], b[2], b[3]);
      }
    }
  }
}

template <int D, int H>
__global__ void __launch_bounds__(kThreads)
    sdpa_flash_kernel(const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                      const std::uint16_t* sinks, std::uint16_t* out, SdpaShape s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // the host launches this kernel on compute capability 8.0 and later only
#else
  extern __shared__ __align__(16) std::uint16_t smem[];
  std::uint16_t* qs = smem;                // H x [64][D]
  std::uint16_t* ks = qs + H * kRows * D;  // 2 x [64][D]
  std::uint16_t* vs = ks + 2 * kKeys * D;  // 2 x [64][D]
  const std::int64_t heads = s.kv_heads * s.q_per_kv;
  const std::int64_t h0 = blockIdx.x * static_cast<std::int64_t>(H), g = h0 / s.q_per_kv;
  // The last rows, which see the most keys, first: blockIdx.y is the slow index of the grid.
  const std::int64_t tiles = (s.tq + kRows - 1) / kRows;
  const std::int64_t row0 = (tiles - 1 - blockIdx.y) * kRows;
  const std::int64_t row_end = row0 + kRows < s.tq ? row0 + kRows : s.tq;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int quad = lane / 4, in_quad = lane % 4;

  // The keys any row of the block sees: from the first row's first to the last row's last.
  std::int64_t first = 0, last = -1, unused = 0;
  key_range(s, row0, first, unused);
  key_range(s, row_end - 1, unused, last);
  const std::int64_t kv_stride = s.kv_heads * D;
  const std::uint16_t* kbase = k + g * D;
  const std::uint16_t* vbase = v + g * D;
  const std::int64_t ntiles = last >= first ? (last - first) / kKeys + 1 : 0;

#pragma unroll
  for (int h = 0; h < H; ++h) {
    load_tile<D, kRows>(qs + h * kRows * D, q + (h0 + h) * D, heads * D, row0, s.tq,
                        static_cast<int>(threadIdx.x), kThreads);
  }
  if (ntiles > 0) {
    load_tile<D, kKeys>(ks, kbase, kv_stride, first, s.tk, static_cast<int>(threadIdx.x), kThreads);
    load_tile<D, kKeys>(vs, vbase, kv_stride, first, s.tk, static_cast<int>(threadIdx.x), kThreads);
  }
  copies_commit();

  // This thread's two rows (quad and quad + 8 of the warp's 16) and their key ranges.
  const std::int64_t my_row[2] = {row0 + warp * 16 + quad, row0 + warp * 16 + quad + 8};
  std::int64_t my_first[2], my_last[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) key_range(s, my_row[i], my_first[i], my_last[i]);
  const float scale = s.scale * kLog2e;           // logits in base 2
  const float folded = scale > 0 ? scale : 1.0f;  // what the softmax multiplies by

  float o[H][D / 8][4];
#pragma unroll
  for (auto& oh : o) {
#pragma unroll
    for (auto& t : oh) t[0] = t[1] = t[2] = t[3] = 0;
  }
  float m[H][2], l[H][2];
#pragma unroll
  for (int h = 0; h < H; ++h) m[h][0] = m[h][1] = kMinusInf, l[h][0] = l[h][1] = 0;

  for (std::int64_t t = 0; t < ntiles; ++t) {
    const int buf = static_cast<int>(t & 1);
    const std::int64_t key0 = first + t * kKeys;
    if (t + 1 < ntiles) {
      load_tile<D, kKeys>(ks + (buf ^ 1) * kKeys * D, kbase, kv_stride, key0 + kKeys, s.tk,
                          static_cast<int>(threadIdx.x), kThreads);
      load_tile<D, kKeys>(vs + (buf ^ 1) * kKeys * D, vbase, kv_stride, key0 + kKeys, s.tk,
                          static_cast<int>(threadIdx.x), kThreads);
    }
    copies_commit();
    copies_wait<1>();
    __syncthreads();
    float sc[H][kKeys / 8][4];
#pragma unroll
    for (auto& sh : sc) {
#pragma unroll
      for (auto& x : sh) x[0] = x[1] = x[2] = x[3] = 0;
    }
    scores<D, H, kKeys>(sc, qs, kRows * D, warp * 16, ks + buf * kKeys * D, lane);
    // A scale of 0 or below is applied first (the softmax folds only a positive one); mask only
    // where some row of the warp does not see the whole tile.
    if (!(scale > 0)) {
#pragma unroll
      for (auto& sh : sc) {
#pragma unroll
        for (auto& x : sh) x[0] *= scale, x[1] *= scale, x[2] *= scale, x[3] *= scale;
      }
    }
    const bool whole = key0 >= my_first[0] && key0 >= my_first[1] &&
                       key0 + kKeys - 1 <= my_last[0] && key0 + kKeys - 1 <= my_last[1];
    if (!__all_sync(0xffffffffu, whole)) {
      int lo[2], hi[2];  // the rows' seen keys relative to key0, clamped to the tile
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const std::int64_t a = my_first[x] - key0, z = my_last[x] - key0;
        lo[x] = static_cast<int>(a < 0 ? 0 : (a > kKeys ? kKeys : a));
        hi[x] = static_cast<int>(z < -1 ? -1 : (z >= kKeys ? kKeys - 1 : z));
      }
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = n * 8 + 2 * in_quad + (e % 2);
          const bool seen = key >= lo[e / 2] && key <= hi[e / 2];
#pragma unroll
          for (int h = 0; h < H; ++h) sc[h][n][e] = seen ? sc[h][n][e] : kMinusInf;
        }
      }
    }
#pragma unroll
    for (int h = 0; h < H; ++h) softmax_tile<D, kKeys>(sc[h], m[h], l[h], o[h], folded);
    weighted_values<D, H, kKeys>(o, sc, vs + buf * kKeys * D, lane);
    __syncthreads();  // the tile's buffers are refilled two iterations on
  }
  copies_wait<0>();

// The sink joins each row's denominator; the output rounded once to bf16.
#pragma unroll
  for (int h = 0; h < H; ++h) {
    const float sink = bf16_to_float(sinks[h0 + h]) * kLog2e;
    const bool sink_counts = !(isinf(sink) && sink < 0);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float li = l[h][i];
      li += __shfl_xor_sync(0xffffffffu, li, 1);
      li += __shfl_xor_sync(0xffffffffu, li, 2);
      const float big = sink_counts ? fmaxf(m[h][i], sink) : m[h][i];
      const float base = big == kMinusInf ? 0.0f : big;
      const float factor = exp2f(m[h][i] - base);
      const float denominator = li * factor + (sink_counts ? exp2f(sink - base) : 0.0f);
      const float f = denominator > 0 ? factor / denominator : 0.0f;
      if (my_row[i] >= s.tq) continue;
      auto* row_out = reinterpret_cast<unsigned*>(out + (my_row[i] * heads + h0 + h) * D);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        row_out[n * 4 + in_quad] = pack_bf16(o[h][n][2 * i] * f, o[h][n][2 * i + 1] * f);
      }
    }
  }
#endif
}

// The decode kernel: see the file's head. Partials as sdpa_batch_partial_kernel's
// (attention_kernel.cu): [rows heads, chunks, D + 2], the max in natural units.
template <int D, int K>
__global__ void __launch_bounds__(32)
    sdpa_batch_flash_kernel(const std::uint16_t* q, const __grid_constant__ SdpaBatch b,
                            SdpaShape s, std::int64_t chunk_keys, std::int64_t chunks,
                            float* part) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // the host launches this kernel on compute capability 8.0 and later only
#else
  extern __shared__ __align__(16) std::uint16_t smem[];
  std::uint16_t* qs = smem;            // [16][D]
  std::uint16_t* tiles = qs + 16 * D;  // 2 x (keys [K][D], values [K][D])
  const int per = static_cast<int>(s.q_per_kv);
  const std::int64_t heads = s.kv_heads * per;
  const std::int64_t row = blockIdx.x / chunks, c = blockIdx.x % chunks, g = blockIdx.y;
  const int lane = static_cast<int>(threadIdx.x), quad = lane / 4, in_quad = lane % 4;
  // The row's sequence and its keys [lo, lo + nk).
  const std::int64_t qrow = b.seq[0].row + row;
  std::int64_t lo = 0, hi = -1;
  const SdpaRun& r = batch_chunk(b, row, c, chunk_keys, s.sliding_window, lo, hi);
  float* pr = part + ((row * heads + g * per) * chunks + c) * (D + 2);
  const std::int64_t pstride = chunks * (D + 2);  // one query head to the next
  const int nk = hi >= lo ? static_cast<int>(hi - lo + 1) : 0;
  if (nk == 0) {  // a chunk past the row's keys: empty
    if (lane < per) pr[lane * pstride + D + 1] = 0;
    return;
  }
  const std::int64_t stride = s.kv_heads * D;
  const auto* kg = static_cast<const std::uint16_t*>(r.k) + g * D + lo * stride;
  const auto* vg = static_cast<const std::uint16_t*>(r.v) + g * D + lo * stride;
  const int ntiles = (nk + K - 1) / K;
  // The first tile in flight before the queries are read.
  load_tile<D, K>(tiles, kg, stride, 0, nk, lane, 32);
  load_tile<D, K>(tiles + K * D, vg, stride, 0, nk, lane, 32);
  copies_commit();
  const std::uint16_t* qg = q + (qrow * heads + g * per) * D;
  for (int x = lane; x < 16 * (D / 8); x += 32) {
    const int qr = x / (D / 8), qc = x % (D / 8);
    const uint4 zero{0, 0, 0, 0};
    *reinterpret_cast<uint4*>(qs + swizzled<D>(qr, qc * 8)) =
        qr < per ? *reinterpret_cast<const uint4*>(qg + qr * D + qc * 8) : zero;
  }
  __syncwarp();
  const float scale = s.scale * kLog2e;           // logits in base 2
  const float folded = scale > 0 ? scale : 1.0f;  // what the softmax multiplies by

  float o[1][D / 8][4];
#pragma unroll
  for (auto& t : o[0]) t[0] = t[1] = t[2] = t[3] = 0;
  float m[2] = {kMinusInf, kMinusInf}, l[2] = {0, 0};
  for (int t = 0; t < ntiles; ++t) {
    // The next tile into the other buffer (last read two iterations ago) while this one is used.
    std::uint16_t* kt = tiles + (t & 1) * 2 * K * D;
    if (t + 1 < ntiles) {
      std::uint16_t* next = tiles + ((t + 1) & 1) * 2 * K * D;
      load_tile<D, K>(next, kg, stride, (t + 1) * K, nk, lane, 32);
      load_tile<D, K>(next + K * D, vg, stride, (t + 1) * K, nk, lane, 32);
    }
    copies_commit();
    copies_wait<1>();
    __syncwarp();
    float sc[1][K / 8][4];
#pragma unroll
    for (auto& x : sc[0]) x[0] = x[1] = x[2] = x[3] = 0;
    scores<D, 1, K>(sc, qs, 0, 0, kt, lane);
    const int valid = nk - t * K;  // keys of the tile the row sees
#pragma unroll
    for (int n = 0; n < K / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n * 8 + 2 * in_quad + (e % 2);
        sc[0][n][e] = key < valid ? (scale > 0 ? sc[0][n][e] : sc[0][n][e] * scale) : kMinusInf;
      }
    }
    softmax_tile<D, K>(sc[0], m, l, o[0], folded);
    weighted_values<D, 1, K>(o, sc, kt + K * D, lane);
    __syncwarp();  // every lane done with the tile before its buffer is refilled
  }
  // The chunk's partials: each thread's two rows (query heads quad and quad + 8).
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    l[x] += __shfl_xor_sync(0xffffffffu, l[x], 1);
    l[x] += __shfl_xor_sync(0xffffffffu, l[x], 2);
    const int mq = quad + 8 * x;
    if (mq >= per) continue;
    float* out = pr + mq * pstride;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<float2*>(out + n * 8 + 2 * in_quad) =
          make_float2(o[0][n][2 * x], o[0][n][2 * x + 1]);
    }
    if (in_quad == 0) out[D] = m[x] * kLn2, out[D + 1] = l[x];
  }
#endif
}

bool tensor_cores() {
  int device = 0, major = 0;  // mma.sync on bf16, ldmatrix and cp.async: 8.0 and later
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 8;
}

// A kernel's shared memory: `bytes` a block, and the multiprocessor's carve-out all shared memory
// (so that as many blocks fit as the registers allow). Per call: the attributes belong to the
// current device's context.
template <class Kernel>
cudaError_t configure(Kernel* kernel, int bytes) {
  const cudaError_t sized =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (sized != cudaSuccess) return sized;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                              cudaSharedmemCarveoutMaxShared);
}

template <int D, int H>
cudaError_t launch(const SdpaShape& s, const void* q, const void* k, const void* v,
                   const void* sinks, void* out, cudaStream_t stream) {
  constexpr int kSmem = (H * kRows + 4 * kKeys) * D * 2;
  const cudaError_t configured = configure(sdpa_flash_kernel<D, H>, kSmem);
  if (configured != cudaSuccess) return configured;
  const dim3 grid(static_cast<unsigned>(s.kv_heads * s.q_per_kv / H),
                  static_cast<unsigned>((s.tq + kRows - 1) / kRows));
  sdpa_flash_kernel<D, H><<<grid, kThreads, kSmem, stream>>>(
      static_cast<const std::uint16_t*>(q), static_cast<const std::uint16_t*>(k),
      static_cast<const std::uint16_t*>(v), static_cast<const std::uint16_t*>(sinks),
      static_cast<std::uint16_t*>(out), s);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_batch(const void* q, const SdpaBatch& b, const SdpaShape& s, float* partials,
                         std::int64_t rows, std::int64_t chunk_keys, std::int64_t chunks,
                         cudaStream_t stream) {
  // The queries' tile, then two buffers of a tile's keys and values.
  constexpr int kSmem = (16 + 2 * 2 * kDecodeKeys) * D * 2;
  const cudaError_t configured = configure(sdpa_batch_flash_kernel<D, kDecodeKeys>, kSmem);
  if (configured != cudaSuccess) return configured;
  const dim3 grid(static_cast<unsigned>(rows * chunks), static_cast<unsigned>(s.kv_heads));
  sdpa_batch_flash_kernel<D, kDecodeKeys><<<grid, 32, kSmem, stream>>>(
      static_cast<const std::uint16_t*>(q), b, s, chunk_keys, chunks, partials);
  return cudaGetLastError();
}

}  // namespace

bool sdpa_flash_fits(Float t, const SdpaShape& s, const void* q, const void* k, const void* v,
                     const void* out) {
  if (t != Float::bf16 || (s.head_dim != 64 && s.head_dim != 128) || s.tq < kFlashMinRows) {
    return false;
  }
  for (const void* p : {q, k, v, out}) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  }
  return tensor_cores();
}

cudaError_t launch_sdpa_flash(const void* q, const void* k, const void* v, const void* sinks,
                              void* out, const SdpaShape& s, cudaStream_t stream) {
  if (s.tq == 0 || s.kv_heads * s.q_per_kv == 0) return cudaSuccess;
  if (s.head_dim == 128) return launch<128, 1>(s, q, k, v, sinks, out, stream);
  return s.q_per_kv % 2 == 0 ? launch<64, 2>(s, q, k, v, sinks, out, stream)
                             : launch<64, 1>(s, q, k, v, sinks, out, stream);
}

bool sdpa_batch_flash_fits(Float t, std::int64_t head_dim, std::int64_t q_per_kv) {
  return t == Float::bf16 && (head_dim == 64 || head_dim == 128) && q_per_kv >= 1 &&
         q_per_kv <= 16 && tensor_cores();
}

cudaError_t launch_sdpa_batch_flash(const void* q, const SdpaBatch& b, const SdpaShape& s,
                                    float* partials, std::int64_t rows, std::int64_t chunk_keys,
                                    std::int64_t chunks, cudaStream_t stream) {
  return s.head_dim == 64 ? launch_batch<64>(q, b, s, partials, rows, chunk_keys, chunks, stream)
                          : launch_batch<128>(q, b, s, partials, rows, chunk_keys, chunks, stream);
}

}  // namespace meshtest::gpu::detail
