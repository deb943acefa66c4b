// linear_kernel: the project's own CUDA kernel, y = x wᵀ (+ bias) on one GPU. Plain types only:
// the .cu includes no meshtest header (nvcc compiles C++17, meshtest's headers are C++20).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace row_parallel_gpu {

/// Edge of the square tiles a block computes (kTile x kTile threads, one output each).
inline constexpr int kTile = 16;
/// The most rows of x (m) and of w (n) one launch takes: the grid's y extent (65535 blocks)
/// and x extent (2^31 - 1 blocks) times kTile.
inline constexpr std::int64_t kMaxRows = 65535LL * kTile;
inline constexpr std::int64_t kMaxCols = 2147483647LL * kTile;

/// Queues on `stream` the tiled kernel y[i, j] = sum_k x[i, k] w[j, k] (+ bias[j] when bias is
/// not null) for x [m, k], w [n, k], bias [n] and y [m, n], row-major in the current device's
/// memory. Each output sums its k products in k order in the dtype (nvcc's default contraction
/// makes each step one fused multiply-add), then adds the bias. Nothing is launched when m or
/// n is 0; k may be 0 (y = bias, or 0). The caller checks the sizes: 0 <= m <= kMaxRows,
/// 0 <= n <= kMaxCols, k >= 0. Returns the launch's error.
cudaError_t launch_linear(const float* x, const float* w, const float* bias, float* y,
                          std::int64_t m, std::int64_t n, std::int64_t k, cudaStream_t stream);
cudaError_t launch_linear(const double* x, const double* w, const double* bias, double* y,
                          std::int64_t m, std::int64_t n, std::int64_t k, cudaStream_t stream);

}  // namespace row_parallel_gpu
