// dp_kernel: what dp.cpp hands to the kernels of dp_kernel.cu (the per-sample reductions of the
// DP-SGD norms and the book-keeping clip). Plain types only, so that nvcc compiles no Eigen or
// fmt. Every kernel exists for f32 and f64 (`f64` selects), summing in its own type.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtest::gpu::detail {

/// Queues out[i] = Σ_k x[i n + k] · y[i n + k] for i < batch (x and y [batch, n]): the Gram
/// matrices' inner product of the ghost norm, or with x = y a sum of squares; with `accumulate`
/// out[i] += that. One block per sample. Returns the launch's error.
cudaError_t launch_sample_dots(bool f64, const void* x, const void* y, std::int64_t batch,
                               std::int64_t n, bool accumulate, void* out, cudaStream_t stream);

/// Queues out[i] = ‖a_i‖² · ‖g_i‖² for i < batch (a [batch, din], g [batch, dout]): the ghost
/// norm of one row. Returns the launch's error.
cudaError_t launch_row_norm_products(bool f64, const void* a, const void* g, std::int64_t batch,
                                     std::int64_t din, std::int64_t dout, void* out,
                                     cudaStream_t stream);

/// Queues out[i] = ‖Σ_t g[i, t, :]‖² for i < batch (g [batch, seq, d]): the bias gradient's
/// per-sample norm. Returns the launch's error.
cudaError_t launch_bias_norms(bool f64, const void* g, std::int64_t batch, std::int64_t seq,
                              std::int64_t d, void* out, cudaStream_t stream);

/// Queues out[i, t, :] = coef[i] · g[i, t, :] (g, out [batch, seq, d]; coef [batch]). Returns
/// the launch's error.
cudaError_t launch_scale_samples(bool f64, const void* g, const void* coef, std::int64_t batch,
                                 std::int64_t seq, std::int64_t d, void* out, cudaStream_t stream);

/// Queues out[j] = Σ_i coef[i] · Σ_t g[i, t, j] for j < d (t, then i ascending). Returns the
/// launch's error.
cudaError_t launch_clipped_bias(bool f64, const void* g, const void* coef, std::int64_t batch,
                                std::int64_t seq, std::int64_t d, void* out, cudaStream_t stream);

}  // namespace meshtest::gpu::detail
