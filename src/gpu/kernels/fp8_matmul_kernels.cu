// The CUDA kernels of the fp8 matmul's GPU versions (interface: fp8_matmul_kernels.hpp).
#include <cuda_fp8.h>

#include <cstdint>

#include "src/gpu/kernels/fp8_matmul_kernels.hpp"

namespace meshtest::gpu::cuda_kernels {

namespace {

/// The value of an e4m3fn code (exact in f32): 1 sign, 4 exponent (bias 7), 3 mantissa bits;
/// exponent 0 is subnormal (m * 2^-9), S.1111.111 is NaN, there is no infinity.
__device__ float decode_e4m3(std::uint8_t c) {
  const int e = (c >> 3) & 0xF, mant = c & 7;
  float v = 0.0f;
  if (e == 15 && mant == 7) {
    v = __int_as_float(0x7fc00000);
  } else if (e == 0) {
    v = ldexpf(static_cast<float>(mant), -9);
  } else {
    v = ldexpf(static_cast<float>(8 + mant), e - 10);
  }
  return (c & 0x80) ? -v : v;
}

__global__ void dequantize_kernel(const std::uint8_t* codes, const float* scales, std::int64_t rows,
                                  std::int64_t cols, std::int64_t block_rows,
                                  std::int64_t block_cols, float* out) {
  const std::int64_t total = rows * cols;
  const std::int64_t scale_cols = (cols + block_cols - 1) / block_cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / cols, c = i % cols;
    out[i] = decode_e4m3(codes[i]) * scales[(r / block_rows) * scale_cols + c / block_cols];
  }
}

// The tiled kernel: a block of 256 threads (8 warps, 2 along M x 4 along N) computes a 128 x 128
// tile of y; each warp 64 x 32 of it as 4 x 4 MMAs of m16n8k16. The K loop stages 64 codes of
// 128 rows of x and of w in shared memory per step.
constexpr int kTileM = 128, kTileN = 128, kTileK = 64;
constexpr int kThreads = 256;
// Row pitch of the staged codes: 64 bytes plus 16, so that the 8 rows a fragment load touches
// fall in distinct banks (pitch 20 words: rows 0..7 start at banks 0, 20, 8, 28, 16, 4, 24, 12).
constexpr int kPitch = kTileK + 16;
constexpr int kWarpM = 64, kWarpN = 32;
constexpr int kFragsM = kWarpM / 16, kFragsN = kWarpN / 8;

/// Two e4m3 codes (low byte first) as two f16 in one register, low half first.
__device__ std::uint32_t codes_to_f16x2(std::uint32_t two_codes) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes & 0xFFFFu), __NV_E4M3);
  return static_cast<std::uint32_t>(h.x) | (static_cast<std::uint32_t>(h.y) << 16);
}

__device__ void mma_f16_f32(float (&c)[4], const std::uint32_t (&a)[4],
                            const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/// Stages codes [row0, row0 + 128) x [k0, k0 + 64) of a [rows, k] matrix into `tile` (pitch
/// kPitch), zero past the matrix's edges (code 0 is +0.0).
__device__ void stage(const std::uint8_t* src, std::int64_t rows, std::int64_t k, std::int64_t row0,
                      std::int64_t k0, std::uint8_t* tile) {
  const bool vector_rows = (k % 16) == 0;
  for (int chunk = threadIdx.x; chunk < kTileM * (kTileK / 16); chunk += kThreads) {
    const int r = chunk / (kTileK / 16), c16 = (chunk % (kTileK / 16)) * 16;
    const std::int64_t gr = row0 + r, gk = k0 + c16;
    uint4* dst = reinterpret_cast<uint4*>(tile + r * kPitch + c16);
    if (gr < rows && vector_rows && gk + 16 <= k) {
      *dst = *reinterpret_cast<const uint4*>(src + gr * k + gk);
    } else {
      alignas(16) std::uint8_t bytes[16];
      for (int j = 0; j < 16; ++j) {
        bytes[j] = (gr < rows && gk + j < k) ? src[gr * k + gk + j] : std::uint8_t{0};
      }
      *dst = *reinterpret_cast<const uint4*>(bytes);
    }
  }
}

__global__ void __launch_bounds__(kThreads) fp8_matmul_tiled_kernel(Fp8Operands op, float* y) {
  __shared__ alignas(16) std::uint8_t x_tile[kTileM * kPitch];
  __shared__ alignas(16) std::uint8_t w_tile[kTileN * kPitch];
  const std::int64_t m0 = static_cast<std::int64_t>(blockIdx.y) * kTileM;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * kTileN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = (warp / 4) * kWarpM, warp_n = (warp % 4) * kWarpN;
  const int group = lane / 4, quad = lane % 4;  // the MMA fragments' row group and column pair
  const std::int64_t nk = (op.k + op.block - 1) / op.block;

  float total[kFragsM][kFragsN][4] = {};
  float partial[kFragsM][kFragsN][4] = {};

  for (std::int64_t k0 = 0; k0 < op.k; k0 += kTileK) {
    __syncthreads();  // the previous step's fragments are read
    stage(op.xq, op.m, op.k, m0, k0, x_tile);
    stage(op.wq, op.n, op.k, n0, k0, w_tile);
    __syncthreads();
    for (int ks = 0; ks < kTileK / 16 && k0 + ks * 16 < op.k; ++ks) {
      // K is permuted inside each 16-chunk alike for both operands: a thread reads 4
      // consecutive codes and uses the first two as the fragment's k pair 2q, 2q + 1 and the
      // last two as 2q + 8, 2q + 9 (the dot product does not depend on the order of its terms).
      const int kb = ks * 16 + quad * 4;
      std::uint32_t b[kFragsN][2];
      for (int j = 0; j < kFragsN; ++j) {
        const std::uint32_t w4 = *reinterpret_cast<const std::uint32_t*>(
            w_tile + (warp_n + j * 8 + group) * kPitch + kb);
        b[j][0] = codes_to_f16x2(w4);
        b[j][1] = codes_to_f16x2(w4 >> 16);
      }
      for (int i = 0; i < kFragsM; ++i) {
        const int r = warp_m + i * 16 + group;
        const std::uint32_t lo = *reinterpret_cast<const std::uint32_t*>(x_tile + r * kPitch + kb);
        const std::uint32_t hi =
            *reinterpret_cast<const std::uint32_t*>(x_tile + (r + 8) * kPitch + kb);
        const std::uint32_t a[4] = {codes_to_f16x2(lo), codes_to_f16x2(hi),
                                    codes_to_f16x2(lo >> 16), codes_to_f16x2(hi >> 16)};
        for (int j = 0; j < kFragsN; ++j) mma_f16_f32(partial[i][j], a, b[j]);
      }
      // The end of a K block (block is a multiple of 16) or of K: its partial, times both
      // scales, goes into the total.
      const std::int64_t k_end = k0 + ks * 16 + 16;
      if (k_end % op.block == 0 || k_end >= op.k) {
        const std::int64_t kblock = (k_end - 1) / op.block;
        float sw[kFragsN][2];
        for (int j = 0; j < kFragsN; ++j) {
          for (int e = 0; e < 2; ++e) {
            const std::int64_t col = n0 + warp_n + j * 8 + quad * 2 + e;
            sw[j][e] = col < op.n ? op.ws[(col / op.block) * nk + kblock] : 0.0f;
          }
        }
        for (int i = 0; i < kFragsM; ++i) {
          for (int h = 0; h < 2; ++h) {
            const std::int64_t row = m0 + warp_m + i * 16 + group + h * 8;
            const float sx = row < op.m ? op.xs[row * nk + kblock] : 0.0f;
            for (int j = 0; j < kFragsN; ++j) {
              for (int e = 0; e < 2; ++e) {
                float& p = partial[i][j][h * 2 + e];
                total[i][j][h * 2 + e] = fmaf(sx * sw[j][e], p, total[i][j][h * 2 + e]);
                p = 0.0f;
              }
            }
          }
        }
      }
    }
  }
  for (int i = 0; i < kFragsM; ++i) {
    for (int h = 0; h < 2; ++h) {
      const std::int64_t row = m0 + warp_m + i * 16 + group + h * 8;
      if (row >= op.m) continue;
      for (int j = 0; j < kFragsN; ++j) {
        for (int e = 0; e < 2; ++e) {
          const std::int64_t col = n0 + warp_n + j * 8 + quad * 2 + e;
          if (col < op.n) y[row * op.n + col] = total[i][j][h * 2 + e];
        }
      }
    }
  }
}

__global__ void transpose_scales_kernel(const float* src, std::int64_t m, std::int64_t nk,
                                        float* dst) {
  const std::int64_t total = m * nk;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t kb = i / m, r = i % m;  // dst index: consecutive threads write consecutively
    dst[i] = src[r * nk + kb];
  }
}

__global__ void fill_bf16_kernel(std::uint16_t* out, std::int64_t n, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 0x9E3779B9u ^ seed;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    const float v = static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    out[i] = static_cast<std::uint16_t>(__float_as_uint(v) >> 16);
  }
}

/// Blocks for a grid-stride loop over n elements.
unsigned grid_for(std::int64_t n, int threads) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

}  // namespace

cudaError_t launch_dequantize(const std::uint8_t* codes, const float* scales, std::int64_t rows,
                              std::int64_t cols, std::int64_t block_rows, std::int64_t block_cols,
                              float* out, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  dequantize_kernel<<<grid_for(rows * cols, 256), 256, 0, stream>>>(codes, scales, rows, cols,
                                                                    block_rows, block_cols, out);
  return cudaGetLastError();
}

cudaError_t launch_fp8_matmul_tiled(const Fp8Operands& op, float* y, cudaStream_t stream) {
  if (op.m == 0 || op.n == 0) return cudaSuccess;
  if (op.k == 0) return cudaMemsetAsync(y, 0, static_cast<std::size_t>(op.m * op.n) * 4, stream);
  const dim3 grid(static_cast<unsigned>((op.n + kTileN - 1) / kTileN),
                  static_cast<unsigned>((op.m + kTileM - 1) / kTileM));
  fp8_matmul_tiled_kernel<<<grid, kThreads, 0, stream>>>(op, y);
  return cudaGetLastError();
}

cudaError_t launch_transpose_scales(const float* src, std::int64_t m, std::int64_t nk, float* dst,
                                    cudaStream_t stream) {
  if (m * nk == 0) return cudaSuccess;
  transpose_scales_kernel<<<grid_for(m * nk, 256), 256, 0, stream>>>(src, m, nk, dst);
  return cudaGetLastError();
}

cudaError_t launch_fill_bf16(std::uint16_t* out, std::int64_t n, std::uint32_t seed,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  fill_bf16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(out, n, seed);
  return cudaGetLastError();
}

}  // namespace meshtest::gpu::cuda_kernels
