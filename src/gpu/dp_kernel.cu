// dp_kernel: the per-sample reductions of the DP-SGD norms and the book-keeping clip, f32 and
// f64, each sum in its own type (a block's threads, then a tree in shared memory).
#include "src/gpu/dp_kernel.hpp"

#include <cstdint>

namespace meshtest::gpu::detail {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 65535;

unsigned grid_of(std::int64_t n) {
  return static_cast<unsigned>(n < 1 ? 1 : (n < kMaxBlocks ? n : kMaxBlocks));
}

/// The sum of every thread's v over the block (all threads call it; the result on all).
template <class T>
__device__ T block_sum(T v) {
  __shared__ T part[kThreads];
  part[threadIdx.x] = v;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) part[threadIdx.x] += part[threadIdx.x + width];
    __syncthreads();
  }
  const T sum = part[0];
  __syncthreads();  // part is reused by the next call
  return sum;
}

template <class T>
__global__ void sample_dots_kernel(const T* x, const T* y, std::int64_t batch, std::int64_t n,
                                   bool accumulate, T* out) {
  for (std::int64_t i = blockIdx.x; i < batch; i += gridDim.x) {
    T acc = 0;
    for (std::int64_t k = threadIdx.x; k < n; k += blockDim.x) acc += x[i * n + k] * y[i * n + k];
    const T sum = block_sum(acc);
    if (threadIdx.x == 0) out[i] = accumulate ? out[i] + sum : sum;
  }
}

template <class T>
__global__ void row_norm_products_kernel(const T* a, const T* g, std::int64_t batch,
                                         std::int64_t din, std::int64_t dout, T* out) {
  for (std::int64_t i = blockIdx.x; i < batch; i += gridDim.x) {
    T sa = 0, sg = 0;
    for (std::int64_t k = threadIdx.x; k < din; k += blockDim.x)
      sa += a[i * din + k] * a[i * din + k];
    for (std::int64_t k = threadIdx.x; k < dout; k += blockDim.x) {
      sg += g[i * dout + k] * g[i * dout + k];
    }
    const T na = block_sum(sa), ng = block_sum(sg);
    if (threadIdx.x == 0) out[i] = na * ng;
  }
}

template <class T>
__global__ void bias_norms_kernel(const T* g, std::int64_t batch, std::int64_t seq, std::int64_t d,
                                  T* out) {
  for (std::int64_t i = blockIdx.x; i < batch; i += gridDim.x) {
    T acc = 0;
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      T s = 0;
      for (std::int64_t t = 0; t < seq; ++t) s += g[(i * seq + t) * d + j];
      acc += s * s;
    }
    const T sum = block_sum(acc);
    if (threadIdx.x == 0) out[i] = sum;
  }
}

template <class T>
__global__ void scale_samples_kernel(const T* g, const T* coef, std::int64_t batch,
                                     std::int64_t seq, std::int64_t d, T* out) {
  const std::int64_t n = batch * seq * d;
  for (std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[k] = coef[k / (seq * d)] * g[k];
  }
}

template <class T>
__global__ void clipped_bias_kernel(const T* g, const T* coef, std::int64_t batch, std::int64_t seq,
                                    std::int64_t d, T* out) {
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < d;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    T acc = 0;
    for (std::int64_t i = 0; i < batch; ++i) {
      T s = 0;
      for (std::int64_t t = 0; t < seq; ++t) s += g[(i * seq + t) * d + j];
      acc += coef[i] * s;
    }
    out[j] = acc;
  }
}

/// f(T{}) for the f32 or f64 kernels.
template <class F>
cudaError_t by_real(bool f64, F&& f) {
  if (f64) {
    f(double{});
  } else {
    f(float{});
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_sample_dots(bool f64, const void* x, const void* y, std::int64_t batch,
                               std::int64_t n, bool accumulate, void* out, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  return by_real(f64, [&](auto tag) {
    using T = decltype(tag);
    sample_dots_kernel<<<grid_of(batch), kThreads, 0, stream>>>(static_cast<const T*>(x),
                                                                static_cast<const T*>(y), batch, n,
                                                                accumulate, static_cast<T*>(out));
  });
}

cudaError_t launch_row_norm_products(bool f64, const void* a, const void* g, std::int64_t batch,
                                     std::int64_t din, std::int64_t dout, void* out,
                                     cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  return by_real(f64, [&](auto tag) {
    using T = decltype(tag);
    row_norm_products_kernel<<<grid_of(batch), kThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(g), batch, din, dout, static_cast<T*>(out));
  });
}

cudaError_t launch_bias_norms(bool f64, const void* g, std::int64_t batch, std::int64_t seq,
                              std::int64_t d, void* out, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  return by_real(f64, [&](auto tag) {
    using T = decltype(tag);
    bias_norms_kernel<<<grid_of(batch), kThreads, 0, stream>>>(static_cast<const T*>(g), batch, seq,
                                                               d, static_cast<T*>(out));
  });
}

cudaError_t launch_scale_samples(bool f64, const void* g, const void* coef, std::int64_t batch,
                                 std::int64_t seq, std::int64_t d, void* out, cudaStream_t stream) {
  const std::int64_t n = batch * seq * d;
  if (n == 0) return cudaSuccess;
  return by_real(f64, [&](auto tag) {
    using T = decltype(tag);
    scale_samples_kernel<<<grid_of((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(g), static_cast<const T*>(coef), batch, seq, d, static_cast<T*>(out));
  });
}

cudaError_t launch_clipped_bias(bool f64, const void* g, const void* coef, std::int64_t batch,
                                std::int64_t seq, std::int64_t d, void* out, cudaStream_t stream) {
  if (d == 0) return cudaSuccess;
  return by_real(f64, [&](auto tag) {
    using T = decltype(tag);
    clipped_bias_kernel<<<grid_of((d + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(g), static_cast<const T*>(coef), batch, seq, d, static_cast<T*>(out));
  });
}

}  // namespace meshtest::gpu::detail
