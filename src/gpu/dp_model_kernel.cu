// dp_model_kernel: the layers and losses of a DP model on a GPU (linear's bias, ReLU, GELU,
// RMSNorm forward and backward, mse and cross entropy), the per-sample sums and the update,
// f32 and f64, each computed in its own type.
#include "src/gpu/dp_model_kernel.hpp"

#include <cstdint>

namespace meshtest::gpu::detail {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 65535;

unsigned blocks_for(std::int64_t n) {
  const std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b < kMaxBlocks ? b : kMaxBlocks));
}

unsigned rows_grid(std::int64_t rows) {
  return static_cast<unsigned>(rows < 1 ? 1 : (rows < kMaxBlocks ? rows : kMaxBlocks));
}

template <class F>
cudaError_t by_type(bool f64, F&& launch) {
  if (f64) {
    launch(double{});
  } else {
    launch(float{});
  }
  return cudaGetLastError();
}

/// Reduces v over the block with `op` (all threads call it; the result on all).
template <class T, class Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T part[kThreads];
  part[threadIdx.x] = v;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) {
      part[threadIdx.x] = op(part[threadIdx.x], part[threadIdx.x + width]);
    }
    __syncthreads();
  }
  const T r = part[0];
  __syncthreads();
  return r;
}

template <class T>
__device__ T plus(T a, T b) {
  return a + b;
}

#define GRID_STRIDE(i, n)                                                                          \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

template <class T>
__global__ void add_bias_kernel(T* y, const T* bias, std::int64_t rows, std::int64_t cols) {
  GRID_STRIDE(i, rows * cols) { y[i] += bias[i % cols]; }
}

template <class T>
__device__ T gelu_cdf(T x) {
  return T(0.5) * (T(1) + erf(x * T(0.70710678118654752440)));
}

template <class T>
__global__ void activation_kernel(bool gelu, const T* x, T* y, std::int64_t n) {
  GRID_STRIDE(i, n) {
    const T v = x[i];
    y[i] = gelu ? T(0.5) * v * (T(1) + erf(v * T(0.70710678118654752440))) : (v > T(0) ? v : T(0));
  }
}

template <class T>
__global__ void activation_backward_kernel(bool gelu, const T* x, const T* g, T* gx,
                                           std::int64_t n) {
  GRID_STRIDE(i, n) {
    const T v = x[i];
    if (gelu) {
      const T pdf = T(0.39894228040143267794) * exp(T(-0.5) * v * v);
      gx[i] = g[i] * (gelu_cdf(v) + v * pdf);
    } else {
      gx[i] = v > T(0) ? g[i] : T(0);
    }
  }
}

template <class T>
__device__ T row_inv_rms(const T* xr, std::int64_t d, double eps) {
  T sq = 0;
  for (std::int64_t c = threadIdx.x; c < d; c += blockDim.x) sq += xr[c] * xr[c];
  const T total = block_reduce(sq, plus<T>);
  return T(1) / sqrt(total / static_cast<T>(d) + static_cast<T>(eps));
}

template <class T>
__global__ void rms_norm_rows_kernel(const T* x, const T* scale, T* y, std::int64_t rows,
                                     std::int64_t d, double eps) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * d;
    const T inv = row_inv_rms(xr, d, eps);
    for (std::int64_t c = threadIdx.x; c < d; c += blockDim.x)
      y[r * d + c] = xr[c] * inv * scale[c];
  }
}

template <class T>
__global__ void rms_norm_rows_backward_kernel(const T* x, const T* scale, const T* g, T* gx,
                                              T* scale_rows, std::int64_t rows, std::int64_t d,
                                              double eps) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * d;
    const T* gr = g + r * d;
    const T inv = row_inv_rms(xr, d, eps);
    T dot = 0;
    for (std::int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      const T xhat = xr[c] * inv;
      dot += gr[c] * scale[c] * xhat;
      scale_rows[r * d + c] = gr[c] * xhat;
    }
    const T mean_dot = block_reduce(dot, plus<T>) / static_cast<T>(d);
    if (gx == nullptr) continue;
    for (std::int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      gx[r * d + c] = inv * (gr[c] * scale[c] - xr[c] * inv * mean_dot);
    }
  }
}

/// out[gi, c] = Σ_t x[gi, t, c] over rows [chunk p, chunk (p + 1)) ∩ [0, seq) of each group, for
/// chunk p of `chunks` (x [groups, seq, d]; out [chunks, groups, d]; one chunk: the whole sum).
template <class T>
__global__ void group_sums_kernel(const T* x, std::int64_t groups, std::int64_t seq, std::int64_t d,
                                  std::int64_t chunk, std::int64_t chunks, T* out) {
  GRID_STRIDE(k, chunks * groups * d) {
    const std::int64_t p = k / (groups * d), i = k % (groups * d), gi = i / d, c = i % d;
    const std::int64_t end = seq < (p + 1) * chunk ? seq : (p + 1) * chunk;
    T acc = 0;
    for (std::int64_t t = p * chunk; t < end; ++t) acc += x[(gi * seq + t) * d + c];
    out[k] = acc;
  }
}

template <class T>
__global__ void mse_rows_kernel(const T* out, const T* y, std::int64_t rows, std::int64_t feat,
                                double scale, T* grad, T* row_loss) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T sq = 0;
    for (std::int64_t c = threadIdx.x; c < feat; c += blockDim.x) {
      const T e = out[r * feat + c] - y[r * feat + c];
      sq += e * e;
      grad[r * feat + c] = e * static_cast<T>(2 * scale);
    }
    const T total = block_reduce(sq, plus<T>);
    if (threadIdx.x == 0) row_loss[r] = total;
  }
}

template <class T>
__device__ T max_of(T a, T b) {
  return a > b ? a : b;
}

template <class T>
__global__ void ce_rows_kernel(const T* out, const void* target, bool target_i64, std::int64_t rows,
                               std::int64_t feat, double scale, T* grad, T* row_loss) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* o = out + r * feat;
    const std::int64_t k = target_i64 ? static_cast<const std::int64_t*>(target)[r]
                                      : static_cast<const std::int32_t*>(target)[r];
    T m = -static_cast<T>(__builtin_huge_val());
    for (std::int64_t c = threadIdx.x; c < feat; c += blockDim.x) m = max_of(m, o[c]);
    m = block_reduce(m, max_of<T>);
    T z = 0;
    for (std::int64_t c = threadIdx.x; c < feat; c += blockDim.x) z += exp(o[c] - m);
    z = block_reduce(z, plus<T>);
    const T s = static_cast<T>(scale);
    for (std::int64_t c = threadIdx.x; c < feat; c += blockDim.x) {
      grad[r * feat + c] = exp(o[c] - m) / z * s - (c == k ? s : T(0));
    }
    if (threadIdx.x == 0) row_loss[r] = log(z) + m - o[k];
  }
}

template <class T>
__global__ void axpy_kernel(T* y, const T* x, double alpha, std::int64_t n) {
  GRID_STRIDE(i, n) { y[i] += static_cast<T>(alpha) * x[i]; }
}

}  // namespace

cudaError_t launch_add_bias(bool f64, void* y, const void* bias, std::int64_t rows,
                            std::int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  return by_type(f64, [&](auto tag) {
    using T = decltype(tag);
    add_bias_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(
        static_cast<T*>(y), static_cast<const T*>(bias), rows, cols);
  });
}

cudaError_t launch_activation(bool f64, bool gelu, const void* x, void* y, std::int64_t n,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return by_type(f64, [&](auto tag) {
    using T = decltype(tag);
    activation_kernel<<<blocks_for(n), kThreads, 0, stream>>>(gelu, static_cast<const T*>(x),
                                                              static_cast<T*>(y), n);
  });
}

cudaError_t launch_activation_backward(bool f64, bool gelu, const void* x, const void* g, void* gx,
                                       std::int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return by_type(f64, [&](auto tag) {
    using T = decltype(tag);
    activation_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
        gelu, static_cast<const T*>(x), static_cast<const T*>(g), static_cast<T*>(gx), n);
  });
}

cudaError_t launch_rms_norm_rows(bool f64, const void* x, const void* scale, void* y,
                                 std::int64_t rows, std::int64_t d, double eps,
                                 cudaStream_t stream) {
  if (rows * d == 0) return cudaSuccess;
  return by_type(f64, [&](auto tag) {
    using T = decltype(tag);
    rms_norm_rows_kernel<<<rows_grid(rows), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(scale), static_cast<T*>(y), rows, d, eps);
  });
}

cudaError_t launch_rms_norm_rows_backward(bool f64, const void* x, const void* scale, const void* g,
                                          void* gx, void* scale_rows, std::int64_t rows,
                                          std::int64_t d, double eps, cudaStream_t stream) {
  if (rows * d == 0) return cudaSuccess;
  return by_type(f64, [&](auto tag) {
    using T = decltype(tag);
    rms_norm_rows_backward_kernel<<<rows_grid(rows), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(scale), static_cast<const T*>(g),
        static_cast<T*>(gx), static_cast<T*>(scale_rows), rows, d, eps);
  });
}

cudaError_t launch_group_sums(bool f64, const void* x, std::int64_t groups, std::int64_t seq,
                              std::int64_t d, void* out, cudaStream_t stream) {
  if (groups * d == 0) return cudaSuccess;
  // Long sums over few columns (a bias gradient's total over B·T rows: d threads, each reading
  // every row) leave the GPU idle: past kRowChunk rows a group's rows are summed in chunks of
  // kRowChunk by a thread each, then the chunks' sums in chunk order, t ascending within.
  constexpr std::int64_t kRowChunk = 256;
  const std::int64_t chunks = seq > 2 * kRowChunk ? (seq + kRowChunk - 1) / kRowChunk : 1;
  cudaError_t status = cudaSuccess;
  (void)by_type(f64, [&](auto tag) {
    using T = decltype(tag);
    if (chunks == 1) {
      group_sums_kernel<<<blocks_for(groups * d), kThreads, 0, stream>>>(
          static_cast<const T*>(x), groups, seq, d, seq, 1, static_cast<T*>(out));
      status = cudaGetLastError();
      return;
    }
    void* parts = nullptr;
    status =
        cudaMallocAsync(&parts, static_cast<std::size_t>(chunks * groups * d) * sizeof(T), stream);
    if (status != cudaSuccess) return;
    group_sums_kernel<<<blocks_for(chunks * groups * d), kThreads, 0, stream>>>(
        static_cast<const T*>(x), groups, seq, d, kRowChunk, chunks, static_cast<T*>(parts));
    // The chunks' sums [chunks, groups · d] summed over the chunks: one group of `chunks` rows.
    group_sums_kernel<<<blocks_for(groups * d), kThreads, 0, stream>>>(
        static_cast<const T*>(parts), 1, chunks, groups * d, chunks, 1, static_cast<T*>(out));
    status = cudaGetLastError();
    const cudaError_t freed = cudaFreeAsync(parts, stream);
    if (status == cudaSuccess) status = freed;
  });
  return status;
}

cudaError_t launch_mse_rows(bool f64, const void* out, const void* y, std::int64_t rows,
                            std::int64_t feat, double scale, void* grad, void* row_loss,
                            cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return by_type(f64, [&](auto tag) {
    using T = decltype(tag);
    mse_rows_kernel<<<rows_grid(rows), kThreads, 0, stream>>>(
        static_cast<const T*>(out), static_cast<const T*>(y), rows, feat, scale,
        static_cast<T*>(grad), static_cast<T*>(row_loss));
  });
}

cudaError_t launch_ce_rows(bool f64, const void* out, const void* target, bool target_i64,
                           std::int64_t rows, std::int64_t feat, double scale, void* grad,
                           void* row_loss, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return by_type(f64, [&](auto tag) {
    using T = decltype(tag);
    ce_rows_kernel<<<rows_grid(rows), kThreads, 0, stream>>>(
        static_cast<const T*>(out), target, target_i64, rows, feat, scale, static_cast<T*>(grad),
        static_cast<T*>(row_loss));
  });
}

cudaError_t launch_axpy(bool f64, void* y, const void* x, double alpha, std::int64_t n,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return by_type(f64, [&](auto tag) {
    using T = decltype(tag);
    axpy_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<T*>(y),
                                                        static_cast<const T*>(x), alpha, n);
  });
}

}  // namespace meshtest::gpu::detail
