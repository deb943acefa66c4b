// fp8_matmul_kernels: the CUDA kernels of the fp8 block-quantized matmul's GPU versions, behind
// a plain interface (no meshtest header: nvcc compiles the .cu as C++17). Shapes as in
// src/kernels/fp8_matmul.hpp: x codes [m, k] with scales xs [m, nk] (1 x b groups), w codes
// [n, k] with scales ws [ceil(n / b), nk] (b x b blocks), nk = ceil(k / b), all row-major; the
// codes are e4m3fn bytes. Every launch is asynchronous on `stream` and returns the launch's error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtest::gpu::cuda_kernels {

/// out [rows, cols] f32 = decode(codes) * scales[r / block_rows][c / block_cols], scales
/// [ceil(rows / block_rows), ceil(cols / block_cols)].
cudaError_t launch_dequantize(const std::uint8_t* codes, const float* scales, std::int64_t rows,
                              std::int64_t cols, std::int64_t block_rows, std::int64_t block_cols,
                              float* out, cudaStream_t stream);

/// The operands of one fp8 matmul on the device.
struct Fp8Operands {
  const std::uint8_t* xq = nullptr;  ///< [m, k]
  const float* xs = nullptr;         ///< [m, nk]
  const std::uint8_t* wq = nullptr;  ///< [n, k]
  const float* ws = nullptr;         ///< [ceil(n / block), nk]
  std::int64_t m = 0, n = 0, k = 0, block = 0;
};

/// y [m, n] f32 = the product, by a tiled tensor-core kernel: 128 x 128 output tiles, the codes
/// staged in shared memory and decoded to f16 (exact for e4m3) as the fragments are read, f16
/// MMAs accumulating each K block's partial in f32, both scales applied once per K block
/// (x's per row, w's per column's N block). Needs block a multiple of 16 (the quantizer's rule).
cudaError_t launch_fp8_matmul_tiled(const Fp8Operands& op, float* y, cudaStream_t stream);

/// dst [nk, m] = src [m, nk] transposed (x's group scales in the layout cuBLASLt's 1 x 128
/// scaling reads: the row index contiguous).
cudaError_t launch_transpose_scales(const float* src, std::int64_t m, std::int64_t nk, float* dst,
                                    cudaStream_t stream);

/// n elements of bf16 (as raw 16-bit words) with values in [-1, 1) from a fixed hash of the
/// index and `seed`: the baseline GEMM's operands, made on the device.
cudaError_t launch_fill_bf16(std::uint16_t* out, std::int64_t n, std::uint32_t seed,
                             cudaStream_t stream);

}  // namespace meshtest::gpu::cuda_kernels
