// elementwise_kernel: gpt-oss SwiGLU, RMSNorm, RoPE's rotation and the row broadcast of a bias,
// f32 and bf16 (as bits); rows copied (the embedding's, a batch of copies).
#include "src/gpu/elementwise_kernel.hpp"

#include "src/gpu/bf16_device.cuh"
#include "src/gpu/row_words.cuh"

#include <cstdint>

namespace meshtest::gpu::detail {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 65535;

// One step's rounding: to bf16 and back for S = bf16, none for f32.
template <class S>
__device__ __forceinline__ float r(float v) {
  if constexpr (sizeof(S) == 2) {
    return widen(narrow(v));
  } else {
    return v;
  }
}

// gpt-oss's clamped SwiGLU of one (glu, linear) pair, each step rounded as on the host.
template <class S>
__device__ __forceinline__ float swiglu_of(float xg, float xl, float alpha, float limit) {
  const float glu = limit < xg ? limit : xg;                           // std::min(xg, limit)
  const float lin = xl < -limit ? -limit : (limit < xl ? limit : xl);  // std::clamp
  const float sig = r<S>(1.0f / (1.0f + expf(-r<S>(alpha * glu))));
  return r<S>(r<S>(glu * sig) * r<S>(lin + 1.0f));
}

// Four pairs a thread: one 16-byte (bf16) or two (f32) loads of x [rows, 2 half] (pair i at
// 2 i, 2 i + 1: the pairs of a row and of the next are contiguous), the four outputs stored
// together, where x and y are 16-byte aligned (`quads`, as DeviceTensor's storage is); the
// other pairs one at a time.
template <class S>
__global__ void swiglu_kernel(const S* x, S* y, std::int64_t n, bool quads_of_pairs, float alpha,
                              float limit) {
  const std::int64_t quads = quads_of_pairs ? n / 4 : 0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t q = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; q < quads;
       q += stride) {
    float v[8];
    if constexpr (sizeof(S) == 2) {
      const uint4 w = reinterpret_cast<const uint4*>(x)[q];
      const unsigned words[4] = {w.x, w.y, w.z, w.w};
      for (int j = 0; j < 4; ++j) {
        v[2 * j] = widen(static_cast<std::uint16_t>(words[j] & 0xffffu));
        v[2 * j + 1] = widen(static_cast<std::uint16_t>(words[j] >> 16));
      }
      uint2 out;
      out.x = narrow(swiglu_of<S>(v[0], v[1], alpha, limit)) |
              (static_cast<unsigned>(narrow(swiglu_of<S>(v[2], v[3], alpha, limit))) << 16);
      out.y = narrow(swiglu_of<S>(v[4], v[5], alpha, limit)) |
              (static_cast<unsigned>(narrow(swiglu_of<S>(v[6], v[7], alpha, limit))) << 16);
      reinterpret_cast<uint2*>(y)[q] = out;
    } else {
      const float4 a = reinterpret_cast<const float4*>(x)[2 * q];
      const float4 b = reinterpret_cast<const float4*>(x)[2 * q + 1];
      reinterpret_cast<float4*>(y)[q] =
          make_float4(swiglu_of<S>(a.x, a.y, alpha, limit), swiglu_of<S>(a.z, a.w, alpha, limit),
                      swiglu_of<S>(b.x, b.y, alpha, limit), swiglu_of<S>(b.z, b.w, alpha, limit));
    }
  }
  for (std::int64_t i =
           4 * quads + blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += stride) {
    store(y, i, swiglu_of<S>(load(x, 2 * i), load(x, 2 * i + 1), alpha, limit));
  }
}

template <class S>
__global__ void broadcast_rows_kernel(const S* bias, S* y, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    y[i] = bias != nullptr ? bias[i % cols] : S{};
  }
}

__global__ void swiglu_backward_kernel(const float* x, const float* grad_out, float* grad_x,
                                       std::int64_t n, float alpha, float limit) {
  for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; c < n;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float x_glu = x[2 * c], x_lin = x[2 * c + 1];
    const float g = limit < x_glu ? limit : x_glu;
    const float l = x_lin < -limit ? -limit : (limit < x_lin ? limit : x_lin);
    const float s = 1.0f / (1.0f + expf(-(alpha * g)));
    const float gc = grad_out[c];
    grad_x[2 * c] = x_glu <= limit ? gc * (l + 1.0f) * s * (1.0f + alpha * g * (1.0f - s)) : 0.0f;
    grad_x[2 * c + 1] = fabsf(x_lin) <= limit ? gc * g * s : 0.0f;
  }
}

// One block per output row (grid-strided), its threads over the row's words.
template <class W>
__global__ void embedding_rows_kernel(const W* table, std::int64_t table_rows, std::int64_t first,
                                      const std::int64_t* ids, std::int64_t n, std::int64_t words,
                                      W* out) {
  for (std::int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const std::int64_t row = ids[i] - first;
    const bool here = row >= 0 && row < table_rows;
    for (std::int64_t c = threadIdx.x; c < words; c += blockDim.x) {
      out[i * words + c] = here ? table[row * words + c] : W{};
    }
  }
}

// Copy blockIdx.y of the batch, its words grid-strided over blockIdx.x's blocks.
template <class W>
__global__ void copy_batch_kernel(CopyBatch b) {
  const auto* from = static_cast<const W*>(b.src[blockIdx.y]);
  auto* to = static_cast<W*>(b.dst[blockIdx.y]);
  const std::int64_t words = b.bytes[blockIdx.y] / static_cast<std::int64_t>(sizeof(W));
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < words;
       j += step) {
    to[j] = from[j];
  }
}

// One block per row (grid-strided): the threads' partial sums of squares, a tree in shared
// memory, then the scaled row.
template <class S>
__global__ void rms_norm_kernel(const S* x, const float* scale, S* y, std::int64_t rows,
                                std::int64_t h, float eps) {
  __shared__ float part[kThreads];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const S* xr = x + row * h;
    float sum = 0;
    for (std::int64_t c = threadIdx.x; c < h; c += blockDim.x) {
      const float v = load(xr, c);
      sum += v * v;
    }
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int width = kThreads / 2; width > 0; width /= 2) {
      if (static_cast<int>(threadIdx.x) < width) part[threadIdx.x] += part[threadIdx.x + width];
      __syncthreads();
    }
    const float inv = 1.0f / sqrtf(part[0] / static_cast<float>(h) + eps);
    __syncthreads();  // every thread has read part[0] before the next row writes it
    for (std::int64_t c = threadIdx.x; c < h; c += blockDim.x) {
      store(y + row * h, c, (load(xr, c) * inv) * scale[c]);
    }
  }
}

template <class S>
__global__ void apply_rope_kernel(const S* x, const S* cos, const S* sin, S* y, std::int64_t tokens,
                                  std::int64_t heads, std::int64_t half) {
  const std::int64_t n = tokens * heads * half;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = i % half, row = i / half, t = row / heads;
    const float c = load(cos, t * half + j), s = load(sin, t * half + j);
    const std::int64_t at = row * 2 * half + j;
    const float x1 = load(x, at), x2 = load(x, at + half);
    // The intrinsics round every product and sum apart, as the host does (no contraction).
    store(y, at, r<S>(__fsub_rn(r<S>(__fmul_rn(x1, c)), r<S>(__fmul_rn(x2, s)))));
    store(y, at + half, r<S>(__fadd_rn(r<S>(__fmul_rn(x2, c)), r<S>(__fmul_rn(x1, s)))));
  }
}

unsigned blocks_for(std::int64_t n) {
  const std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

}  // namespace

cudaError_t launch_swiglu(Float t, const void* x, void* y, std::int64_t rows, std::int64_t half,
                          float alpha, float limit, cudaStream_t stream) {
  const std::int64_t n = rows * half;
  if (n == 0) return cudaSuccess;
  const bool quads = reinterpret_cast<std::uintptr_t>(x) % 16 == 0 &&
                     reinterpret_cast<std::uintptr_t>(y) % 16 == 0 && n >= 4;
  const unsigned grid = blocks_for(quads ? n / 4 : n);
  if (t == Float::bf16) {
    swiglu_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const std::uint16_t*>(x),
                                                 static_cast<std::uint16_t*>(y), n, quads, alpha,
                                                 limit);
  } else {
    swiglu_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(x),
                                                 static_cast<float*>(y), n, quads, alpha, limit);
  }
  return cudaGetLastError();
}

cudaError_t launch_swiglu_backward(const float* x, const float* grad_out, float* grad_x,
                                   std::int64_t n, float alpha, float limit, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  swiglu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, grad_out, grad_x, n, alpha,
                                                                 limit);
  return cudaGetLastError();
}

cudaError_t launch_rms_norm(Float t, const void* x, const float* scale, void* y, std::int64_t rows,
                            std::int64_t h, float eps, cudaStream_t stream) {
  if (rows * h == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
  if (t == Float::bf16) {
    rms_norm_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const std::uint16_t*>(x), scale,
                                                     static_cast<std::uint16_t*>(y), rows, h, eps);
  } else {
    rms_norm_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(x), scale,
                                                     static_cast<float*>(y), rows, h, eps);
  }
  return cudaGetLastError();
}

cudaError_t launch_apply_rope(Float t, const void* x, const void* cos, const void* sin, void* y,
                              std::int64_t tokens, std::int64_t heads, std::int64_t half,
                              cudaStream_t stream) {
  const std::int64_t n = tokens * heads * half;
  if (n == 0) return cudaSuccess;
  if (t == Float::bf16) {
    using B = std::uint16_t;
    apply_rope_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<const B*>(x), static_cast<const B*>(cos), static_cast<const B*>(sin),
        static_cast<B*>(y), tokens, heads, half);
  } else {
    apply_rope_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<const float*>(x), static_cast<const float*>(cos),
        static_cast<const float*>(sin), static_cast<float*>(y), tokens, heads, half);
  }
  return cudaGetLastError();
}

cudaError_t launch_broadcast_rows(Float t, const void* bias, void* y, std::int64_t rows,
                                  std::int64_t cols, cudaStream_t stream) {
  const std::int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  if (t == Float::bf16) {
    broadcast_rows_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<const std::uint16_t*>(bias), static_cast<std::uint16_t*>(y), rows, cols);
  } else {
    broadcast_rows_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<const float*>(bias), static_cast<float*>(y), rows, cols);
  }
  return cudaGetLastError();
}

cudaError_t launch_embedding_rows(const void* table, std::int64_t table_rows, std::int64_t first,
                                  const std::int64_t* ids, std::int64_t n, std::int64_t row_bytes,
                                  void* out, cudaStream_t stream) {
  if (n == 0 || row_bytes == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(n < kMaxBlocks ? n : kMaxBlocks);
  with_row_words(row_bytes, table, out, [&](auto tag) {
    using W = decltype(tag);
    const std::int64_t words = row_bytes / static_cast<std::int64_t>(sizeof(W));
    embedding_rows_kernel<<<grid, row_threads(words, kThreads), 0, stream>>>(
        static_cast<const W*>(table), table_rows, first, ids, n, words, static_cast<W*>(out));
  });
  return cudaGetLastError();
}

cudaError_t launch_copy_batch(const CopyBatch& b, cudaStream_t stream) {
  std::int64_t most = 0;  // the largest copy's bytes
  std::uintptr_t bits = 0;
  for (int i = 0; i < b.n; ++i) {
    most = b.bytes[i] > most ? b.bytes[i] : most;
    bits |= reinterpret_cast<std::uintptr_t>(b.src[i]) |
            reinterpret_cast<std::uintptr_t>(b.dst[i]) | static_cast<std::uintptr_t>(b.bytes[i]);
  }
  if (most == 0) return cudaSuccess;
  // The lowest bit set in any size or address: the words that divide all of them.
  const auto lowest = static_cast<std::int64_t>(bits & (~bits + 1));
  with_row_words(lowest, nullptr, nullptr, [&](auto tag) {
    using W = decltype(tag);
    const std::int64_t words = most / static_cast<std::int64_t>(sizeof(W));
    const std::int64_t blocks = (words + kThreads - 1) / kThreads;
    const dim3 grid(static_cast<unsigned>(blocks < 1024 ? blocks : 1024),
                    static_cast<unsigned>(b.n));
    copy_batch_kernel<W><<<grid, kThreads, 0, stream>>>(b);
  });
  return cudaGetLastError();
}

}  // namespace meshtest::gpu::detail
