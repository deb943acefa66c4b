// linear_kernel: a shared-memory tiled GEMM with wᵀ, y = x wᵀ (+ bias), f32 and f64.
#include "linear_kernel.hpp"

namespace row_parallel_gpu {
namespace {

// Block (bx, by) computes the kTile x kTile tile of y at rows by*kTile.., columns bx*kTile..;
// thread (tx, ty) its element (row by*kTile + ty, column bx*kTile + tx). For each step of kTile
// along k the block stages a tile of x (its rows) and one of w (its columns of y), each thread
// loading one element of each, coalesced along k; out-of-range elements are staged as 0.
// The +1 column keeps ws[tx][t] (a stride of kTile + 1 across the warp) free of bank conflicts.
template <class T>
__global__ void linear_tiled(const T* __restrict__ x, const T* __restrict__ w,
                             const T* __restrict__ bias, T* __restrict__ y, std::int64_t m,
                             std::int64_t n, std::int64_t k) {
  __shared__ T xs[kTile][kTile + 1];  // xs[i][t] = x[row0 + i, k0 + t]
  __shared__ T ws[kTile][kTile + 1];  // ws[j][t] = w[col0 + j, k0 + t]
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.y) * kTile;
  const std::int64_t col0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  T acc = 0;
  for (std::int64_t k0 = 0; k0 < k; k0 += kTile) {
    const std::int64_t kk = k0 + tx;
    xs[ty][tx] = (row0 + ty < m && kk < k) ? x[(row0 + ty) * k + kk] : T(0);
    ws[ty][tx] = (col0 + ty < n && kk < k) ? w[(col0 + ty) * k + kk] : T(0);
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kTile; ++t) acc += xs[ty][t] * ws[tx][t];
    __syncthreads();
  }
  const std::int64_t row = row0 + ty, col = col0 + tx;
  if (row < m && col < n) y[row * n + col] = bias != nullptr ? acc + bias[col] : acc;
}

template <class T>
cudaError_t launch(const T* x, const T* w, const T* bias, T* y, std::int64_t m, std::int64_t n,
                   std::int64_t k, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  const dim3 block(kTile, kTile);
  const dim3 grid(static_cast<unsigned>((n + kTile - 1) / kTile),
                  static_cast<unsigned>((m + kTile - 1) / kTile));
  linear_tiled<T><<<grid, block, 0, stream>>>(x, w, bias, y, m, n, k);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_linear(const float* x, const float* w, const float* bias, float* y,
                          std::int64_t m, std::int64_t n, std::int64_t k, cudaStream_t stream) {
  return launch(x, w, bias, y, m, n, k, stream);
}

cudaError_t launch_linear(const double* x, const double* w, const double* bias, double* y,
                          std::int64_t m, std::int64_t n, std::int64_t k, cudaStream_t stream) {
  return launch(x, w, bias, y, m, n, k, stream);
}

}  // namespace row_parallel_gpu
