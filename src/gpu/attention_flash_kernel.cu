// attention_flash_kernel: sdpa_sinks in bf16 on tensor cores, flash-style: a block of four warps
// per 64 query rows and head, each warp 16 rows, the scores q·kᵀ and the weighted values p·v as
// mma.sync m16n8k16 (bf16 in, f32 sums), the keys and values in tiles of 64 staged in shared
// memory by cp.async, the next tile's loads in flight while this one is used.
#include "src/gpu/attention_kernel.hpp"

#include <cuda_runtime.h>

#include <cstdint>

#include "src/gpu/attention_keys.cuh"

namespace meshtest::gpu::detail {
namespace {

constexpr int kRows = 64;  // query rows per block (16 per warp)
constexpr int kKeys = 64;  // keys per tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;
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

__device__ __forceinline__ float bf16_to_float(std::uint16_t b) {
  return __uint_as_float(static_cast<unsigned>(b) << 16);
}

// The keys [first, last] of query row `row` (empty when first > last).
__device__ __forceinline__ void key_range(const SdpaShape& s, std::int64_t row, std::int64_t& first,
                                          std::int64_t& last) {
  keys_seen(s.q_offset + row, s.k_offset, s.tk, s.sliding_window, first, last);
}

// Loads rows [row0, row0 + 64) of a [rows, stride] bf16 matrix (row r at base + r * stride) into a
// swizzled tile; rows at or past `rows` (and below 0) read as zeros.
template <int D>
__device__ __forceinline__ void load_tile(std::uint16_t* tile, const std::uint16_t* base,
                                          std::int64_t stride, std::int64_t row0,
                                          std::int64_t rows) {
  constexpr int kChunks = D / 8;  // 16-byte chunks a row
  for (int i = static_cast<int>(threadIdx.x); i < kKeys * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const std::int64_t g = row0 + r;
    const bool valid = g >= 0 && g < rows;
    copy16(tile + swizzled<D>(r, c * 8), base + (valid ? g : 0) * stride + c * 8, valid);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    sdpa_flash_kernel(const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                      const std::uint16_t* sinks, std::uint16_t* out, SdpaShape s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // the host launches this kernel on compute capability 8.0 and later only
#else
  constexpr int kSteps = D / 16;  // k-steps of q·kᵀ, n-tile pairs of p·v
  extern __shared__ __align__(16) std::uint16_t smem[];
  std::uint16_t* qs = smem;                // [64][D]
  std::uint16_t* ks = qs + kRows * D;      // 2 x [64][D]
  std::uint16_t* vs = ks + 2 * kKeys * D;  // 2 x [64][D]
  const std::int64_t heads = s.kv_heads * s.q_per_kv;
  const std::int64_t h = blockIdx.y, g = h / s.q_per_kv;
  // The last rows, which see the most keys, first.
  const std::int64_t tiles = (s.tq + kRows - 1) / kRows;
  const std::int64_t row0 = (tiles - 1 - blockIdx.x) * kRows;
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

  load_tile<D>(qs, q + h * D, heads * D, row0, s.tq);
  if (ntiles > 0) {
    load_tile<D>(ks, kbase, kv_stride, first, s.tk);
    load_tile<D>(vs, vbase, kv_stride, first, s.tk);
  }
  copies_commit();

  // This thread's two rows (quad and quad + 8 of the warp's 16) and their key ranges.
  const std::int64_t my_row[2] = {row0 + warp * 16 + quad, row0 + warp * 16 + quad + 8};
  std::int64_t my_first[2], my_last[2];
  for (int i = 0; i < 2; ++i) key_range(s, my_row[i], my_first[i], my_last[i]);
  const float scale = s.scale * kLog2e;  // logits in base 2

  unsigned qa[kSteps][4];
  float o[2 * kSteps][4];
  for (auto& t : o) t[0] = t[1] = t[2] = t[3] = 0;
  float m[2] = {kMinusInf, kMinusInf}, l[2] = {0, 0};

  for (std::int64_t t = 0; t < ntiles; ++t) {
    const int buf = static_cast<int>(t & 1);
    const std::int64_t key0 = first + t * kKeys;
    if (t + 1 < ntiles) {
      load_tile<D>(ks + (buf ^ 1) * kKeys * D, kbase, kv_stride, key0 + kKeys, s.tk);
      load_tile<D>(vs + (buf ^ 1) * kKeys * D, vbase, kv_stride, key0 + kKeys, s.tk);
    }
    copies_commit();
    copies_wait<1>();
    __syncthreads();
    if (t == 0) {
      for (int kk = 0; kk < kSteps; ++kk) {
        const int r = warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2), c = kk * 16 + 8 * (lane / 16);
        ldmatrix_x4(qa[kk], qs + swizzled<D>(r, c));
      }
    }
    const std::uint16_t* kt = ks + buf * kKeys * D;
    const std::uint16_t* vt = vs + buf * kKeys * D;

    // Scores of the warp's 16 rows against the tile's 64 keys: 8 n-tiles of 8 keys.
    float sc[kKeys / 8][4];
    for (auto& x : sc) x[0] = x[1] = x[2] = x[3] = 0;
    for (int kk = 0; kk < kSteps; ++kk) {
      for (int np = 0; np < kKeys / 16; ++np) {
        unsigned b[4];
        const int r = np * 16 + (lane % 8) + 8 * (lane / 16), c = kk * 16 + 8 * ((lane / 8) % 2);
        ldmatrix_x4(b, kt + swizzled<D>(r, c));
        mma(sc[2 * np], qa[kk], b[0], b[1]);
        mma(sc[2 * np + 1], qa[kk], b[2], b[3]);
      }
    }
    // Scale, mask, and the online softmax of each of the thread's two rows.
    float tile_max[2] = {kMinusInf, kMinusInf};
    for (int n = 0; n < kKeys / 8; ++n) {
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2;
        const std::int64_t key = key0 + n * 8 + 2 * in_quad + (e % 2);
        const bool seen = key >= my_first[i] && key <= my_last[i];
        sc[n][e] = seen ? sc[n][e] * scale : kMinusInf;
        tile_max[i] = fmaxf(tile_max[i], sc[n][e]);
      }
    }
    float correction[2];
    for (int i = 0; i < 2; ++i) {
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
      const float m_new = fmaxf(m[i], tile_max[i]);
      const float base = m_new == kMinusInf ? 0.0f : m_new;  // a row with no key yet
      correction[i] = exp2f(m[i] - base);
      m[i] = m_new;
      l[i] *= correction[i];
      for (int n = 0; n < kKeys / 8; ++n) {
        for (int e = 2 * i; e < 2 * i + 2; ++e) {
          sc[n][e] = exp2f(sc[n][e] - base);
          l[i] += sc[n][e];
        }
      }
    }
    for (auto& t2 : o) {
      t2[0] *= correction[0], t2[1] *= correction[0];
      t2[2] *= correction[1], t2[3] *= correction[1];
    }
    // o += p v: the scores' accumulator tiles are the A fragments of p (rounded to bf16).
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const unsigned pa[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]),
                              pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
      for (int dp = 0; dp < kSteps; ++dp) {
        unsigned b[4];
        const int r = kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2), c = dp * 16 + 8 * (lane / 16);
        ldmatrix_x4_trans(b, vt + swizzled<D>(r, c));
        mma(o[2 * dp], pa, b[0], b[1]);
        mma(o[2 * dp + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // the tile's buffers are refilled two iterations on
  }
  copies_wait<0>();

  // The sink joins each row's denominator; the output rounded once to bf16.
  const float sink = bf16_to_float(sinks[h]) * kLog2e;
  const bool sink_counts = !(isinf(sink) && sink < 0);
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    const float big = sink_counts ? fmaxf(m[i], sink) : m[i];
    const float base = big == kMinusInf ? 0.0f : big;
    const float factor = exp2f(m[i] - base);
    const float denominator = l[i] * factor + (sink_counts ? exp2f(sink - base) : 0.0f);
    const float f = denominator > 0 ? factor / denominator : 0.0f;
    if (my_row[i] >= s.tq) continue;
    auto* row_out = reinterpret_cast<unsigned*>(out + (my_row[i] * heads + h) * D);
    for (int n = 0; n < 2 * kSteps; ++n) {
      row_out[n * 4 + in_quad] = pack_bf16(o[n][2 * i] * f, o[n][2 * i + 1] * f);
    }
  }
#endif
}

template <int D>
cudaError_t launch(const SdpaShape& s, const void* q, const void* k, const void* v,
                   const void* sinks, void* out, cudaStream_t stream) {
  constexpr int kSmem = (kRows + 4 * kKeys) * D * 2;
  // Per call: the attribute belongs to the current device's context.
  const cudaError_t configured = cudaFuncSetAttribute(
      sdpa_flash_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (configured != cudaSuccess) return configured;
  const dim3 grid(static_cast<unsigned>((s.tq + kRows - 1) / kRows),
                  static_cast<unsigned>(s.kv_heads * s.q_per_kv));
  sdpa_flash_kernel<D><<<grid, kThreads, kSmem, stream>>>(
      static_cast<const std::uint16_t*>(q), static_cast<const std::uint16_t*>(k),
      static_cast<const std::uint16_t*>(v), static_cast<const std::uint16_t*>(sinks),
      static_cast<std::uint16_t*>(out), s);
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
  int device = 0, major = 0;  // mma.sync on bf16, ldmatrix and cp.async: 8.0 and later
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 8;
}

cudaError_t launch_sdpa_flash(const void* q, const void* k, const void* v, const void* sinks,
                              void* out, const SdpaShape& s, cudaStream_t stream) {
  if (s.tq == 0 || s.kv_heads * s.q_per_kv == 0) return cudaSuccess;
  return s.head_dim == 64 ? launch<64>(s, q, k, v, sinks, out, stream)
                          : launch<128>(s, q, k, v, sinks, out, stream);
}

}  // namespace meshtest::gpu::detail
