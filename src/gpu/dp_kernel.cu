// dp_kernel: the per-sample reductions of the DP-SGD norms and the book-keeping clip, f32 and
// f64, each sum in its own type (a block's threads, then a tree in shared memory). A sample's
// long sum (past kChunk elements) is cut into chunks, a block each, whose partial sums a second
// pass adds in chunk order: the same order on every run, and the whole GPU reading instead of a
// block per sample (which left wide4's per-sample gradients, 64 MB a sample, at a few GB/s).
#include "src/gpu/dp_kernel.hpp"

#include <cstdint>

#include "src/gpu/dp_model_kernel.hpp"

namespace meshtest::gpu::detail {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 65535;
constexpr std::int64_t kChunk = 64 * kThreads;  // elements a block sums in a sample's long sum

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

/// out[i] (+)= Σ_k x[i, k] y[i, k] (y null: Σ_k x[i, k]): a block per sample.
template <class T>
__global__ void sample_dots_kernel(const T* x, const T* y, std::int64_t batch, std::int64_t n,
                                   bool accumulate, T* out) {
  for (std::int64_t i = blockIdx.x; i < batch; i += gridDim.x) {
    T acc = 0;
    for (std::int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      acc += y == nullptr ? x[i * n + k] : x[i * n + k] * y[i * n + k];
    }
    const T sum = block_sum(acc);
    if (threadIdx.x == 0) out[i] = accumulate ? out[i] + sum : sum;
  }
}

/// parts[i, p] = Σ x[i, k] y[i, k] over chunk p of sample i (k in [p kChunk, (p + 1) kChunk)):
/// a block per (chunk, sample).
template <class T>
__global__ void sample_dot_parts_kernel(const T* x, const T* y, std::int64_t batch, std::int64_t n,
                                        std::int64_t chunks, T* parts) {
  for (std::int64_t i = blockIdx.y; i < batch; i += gridDim.y) {
    for (std::int64_t p = blockIdx.x; p < chunks; p += gridDim.x) {
      const std::int64_t end = n < (p + 1) * kChunk ? n : (p + 1) * kChunk;
      T acc = 0;
      for (std::int64_t k = p * kChunk + threadIdx.x; k < end; k += blockDim.x) {
        acc += x[i * n + k] * y[i * n + k];
      }
      const T sum = block_sum(acc);
      if (threadIdx.x == 0) parts[i * chunks + p] = sum;
    }
  }
}

/// out[j] = Σ_i coef[i] sums[i, j].
template <class T>
__global__ void weighted_column_sums_kernel(const T* sums, const T* coef, std::int64_t batch,
                                            std::int64_t d, T* out) {
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < d;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    T acc = 0;
    for (std::int64_t i = 0; i < batch; ++i) acc += coef[i] * sums[i * d + j];
    out[j] = acc;
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
__global__ void scale_samples_kernel(const T* g, const T* coef, std::int64_t batch,
                                     std::int64_t seq, std::int64_t d, T* out) {
  const std::int64_t n = batch * seq * d;
  for (std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[k] = coef[k / (seq * d)] * g[k];
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

/// Scratch of `count` T on `stream`, in its order (cudaMallocAsync: capturable in a graph).
template <class T>
T* scratch(std::int64_t count, cudaStream_t stream, cudaError_t& status) {
  void* p = nullptr;
  status = cudaMallocAsync(&p, static_cast<std::size_t>(count) * sizeof(T), stream);
  return static_cast<T*>(p);
}

/// out[i] (+)= Σ_k x[i, k] y[i, k]: a block per sample, or past 2 kChunk elements the chunks'
/// partial sums first.
template <class T>
cudaError_t sample_dots(const T* x, const T* y, std::int64_t batch, std::int64_t n, bool accumulate,
                        T* out, cudaStream_t stream) {
  if (n <= 2 * kChunk) {
    sample_dots_kernel<<<grid_of(batch), kThreads, 0, stream>>>(x, y, batch, n, accumulate, out);
    return cudaGetLastError();
  }
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  cudaError_t status = cudaSuccess;
  T* parts = scratch<T>(batch * chunks, stream, status);
  if (status != cudaSuccess) return status;
  const dim3 grid(static_cast<unsigned>(chunks < kMaxBlocks ? chunks : kMaxBlocks),
                  static_cast<unsigned>(batch < kMaxBlocks ? batch : kMaxBlocks));
  sample_dot_parts_kernel<<<grid, kThreads, 0, stream>>>(x, y, batch, n, chunks, parts);
  // Then each sample's parts in chunk order (y null: a plain sum).
  sample_dots_kernel<<<grid_of(batch), kThreads, 0, stream>>>(parts, static_cast<const T*>(nullptr),
                                                              batch, chunks, accumulate, out);
  const cudaError_t launched = cudaGetLastError();
  status = cudaFreeAsync(parts, stream);
  return launched != cudaSuccess ? launched : status;
}

}  // namespace

cudaError_t launch_sample_dots(bool f64, const void* x, const void* y, std::int64_t batch,
                               std::int64_t n, bool accumulate, void* out, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  (void)by_real(f64, [&](auto tag) {
    using T = decltype(tag);
    status = sample_dots(static_cast<const T*>(x), static_cast<const T*>(y), batch, n, accumulate,
                         static_cast<T*>(out), stream);
  });
  return status;
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
  cudaError_t status = cudaSuccess;
  (void)by_real(f64, [&](auto tag) {
    using T = decltype(tag);
    // The bias gradient of each sample, Σ_t g_it, then its squared norm.
    if (d == 0) {
      status = cudaMemsetAsync(out, 0, static_cast<std::size_t>(batch) * sizeof(T), stream);
      return;
    }
    T* sums = scratch<T>(batch * d, stream, status);
    if (status != cudaSuccess) return;
    status = launch_group_sums(f64, g, batch, seq, d, sums, stream);
    if (status == cudaSuccess) {
      status = sample_dots<T>(sums, sums, batch, d, false, static_cast<T*>(out), stream);
    }
    const cudaError_t freed = cudaFreeAsync(sums, stream);
    if (status == cudaSuccess) status = freed;
  });
  return status;
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
  cudaError_t status = cudaSuccess;
  (void)by_real(f64, [&](auto tag) {
    using T = decltype(tag);
    // Each sample's bias gradient Σ_t g_it, then Σ_i c_i of them (zeros for no sample).
    T* sums = batch > 0 ? scratch<T>(batch * d, stream, status) : nullptr;
    if (status != cudaSuccess) return;
    if (batch > 0) status = launch_group_sums(f64, g, batch, seq, d, sums, stream);
    if (status == cudaSuccess) {
      weighted_column_sums_kernel<<<grid_of((d + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
          sums, static_cast<const T*>(coef), batch, d, static_cast<T*>(out));
      status = cudaGetLastError();
    }
    if (sums != nullptr) {
      const cudaError_t freed = cudaFreeAsync(sums, stream);
      if (status == cudaSuccess) status = freed;
    }
  });
  return status;
}

}  // namespace meshtest::gpu::detail
