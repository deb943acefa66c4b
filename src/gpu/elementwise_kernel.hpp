// elementwise_kernel: what swiglu.cpp, blas.cpp and kv_cache.cpp (among others) hand to the kernels
// of elementwise_kernel.cu.
// Plain types only, so that nvcc compiles no Eigen or fmt.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtest::gpu::detail {

/// The stored type of a kernel's tensors: f32, or bf16 computed in f32 and rounded to nearest
/// even after each step.
enum class Float : std::uint8_t { f32, bf16 };

/// Queues y[r, j] = swiglu(x[r, 2j], x[r, 2j + 1]) for r < rows, j < half (x: [rows, 2 half],
/// y: [rows, half]) on `stream`, with the CPU op's steps and roundings (src/ops/activations.cpp):
///   glu = min(x_glu, limit), lin = clamp(x_lin, -limit, limit) (NaN passes through both),
///   sig = r(1 / (1 + exp(-r(alpha · glu)))), y = r(r(glu · sig) · r(lin + 1));
/// r rounds to bf16 for Float::bf16 and is the identity for f32. Returns the launch's error.
cudaError_t launch_swiglu(Float t, const void* x, void* y, std::int64_t rows, std::int64_t half,
                          float alpha, float limit, cudaStream_t stream);

/// Queues the backward of launch_swiglu in f32 (the CPU's swiglu_backward,
/// src/ops/swiglu_grad.cpp): for pair c < n (x [n, 2] as glu, lin; grad_out [n]), with
/// g = min(x_glu, limit), l = clamp(x_lin, -limit, limit), s = 1 / (1 + exp(-alpha g)):
///   gx_glu = x_glu <= limit ? grad · (l + 1) · s · (1 + alpha g (1 - s)) : 0,
///   gx_lin = |x_lin| <= limit ? grad · g · s : 0.   Returns the launch's error.
cudaError_t launch_swiglu_backward(const float* x, const float* grad_out, float* grad_x,
                                   std::int64_t n, float alpha, float limit, cudaStream_t stream);

/// Queues the CPU rms_norm (src/ops/rms_norm.cpp) of each row r < rows of x [rows, h]:
///   y[r, c] = r(x[r, c] · inv) · scale[c] rounded once to the stored type, inv = 1 / sqrt(
///   Σ_c x[r, c]² / h + eps) in f32; the sum of squares is a tree over one block's threads (not
///   the host's order: within the error model). scale: [h] f32. Returns the launch's error.
cudaError_t launch_rms_norm(Float t, const void* x, const float* scale, void* y, std::int64_t rows,
                            std::int64_t h, float eps, cudaStream_t stream);

/// Queues the CPU apply_rope (src/ops/rope.cpp) of x [tokens, heads, 2 half] by the table rows
/// cos, sin [tokens, half] (x's stored type) into y: with x1 = x[.., j], x2 = x[.., half + j],
///   y[.., j] = r(r(x1 c) - r(x2 s)),  y[.., half + j] = r(r(x2 c) + r(x1 s)),
/// each product and sum rounded apart (no fused multiply-add; r rounds to bf16 for bf16).
/// Returns the launch's error.
cudaError_t launch_apply_rope(Float t, const void* x, const void* cos, const void* sin, void* y,
                              std::int64_t tokens, std::int64_t heads, std::int64_t half,
                              cudaStream_t stream);

/// Queues y[r, j] = bias[j] (or 0 when bias is null) for r < rows, j < cols on `stream`.
cudaError_t launch_broadcast_rows(Float t, const void* bias, void* y, std::int64_t rows,
                                  std::int64_t cols, cudaStream_t stream);

/// Queues out[i, :] = table[ids[i] - first, :] where first <= ids[i] < first + table_rows, else
/// zeros, for i < n: rows of `row_bytes` bytes, copied as bytes (in the widest of 16, 8, 4, 2 or
/// 1 that divides a row and both buffers' addresses). Returns the launch's error.
cudaError_t launch_embedding_rows(const void* table, std::int64_t table_rows, std::int64_t first,
                                  const std::int64_t* ids, std::int64_t n, std::int64_t row_bytes,
                                  void* out, cudaStream_t stream);

/// Copies for launch_copy_batch, passed to the kernel by value (3 KB of parameters): copy i moves
/// bytes[i] bytes from src[i] to dst[i].
struct CopyBatch {
  static constexpr int kMax = 128;
  const void* src[kMax];
  void* dst[kMax];
  std::int64_t bytes[kMax];
  int n = 0;
};

/// Queues the b.n copies of `b` (device memory; no copy's destination overlaps another's source
/// or destination) in one launch, each by blocks of threads in the widest word that divides every
/// size and address of the batch. Returns the launch's error.
cudaError_t launch_copy_batch(const CopyBatch& b, cudaStream_t stream);

}  // namespace meshtest::gpu::detail
