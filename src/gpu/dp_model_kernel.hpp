// dp_model_kernel: what dp_model.cpp hands to the kernels of dp_model_kernel.cu (the layers and
// losses of a DP model on a GPU). Plain types only, so that nvcc compiles no Eigen or fmt. Every
// kernel exists for f32 and f64 (`f64` selects) and computes in that type.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtest::gpu::detail {

/// y[r, c] += bias[c] for r < rows, c < cols.
cudaError_t launch_add_bias(bool f64, void* y, const void* bias, std::int64_t rows,
                            std::int64_t cols, cudaStream_t stream);

/// y = max(x, 0), or with `gelu` the erf form 0.5 x (1 + erf(x / √2)); n elements.
cudaError_t launch_activation(bool f64, bool gelu, const void* x, void* y, std::int64_t n,
                              cudaStream_t stream);

/// gx = g · (x > 0), or with `gelu` g · (Φ(x) + x φ(x)) (the CPU's gelu_backward); n elements.
cudaError_t launch_activation_backward(bool f64, bool gelu, const void* x, const void* g, void* gx,
                                       std::int64_t n, cudaStream_t stream);

/// The CPU's rms_norm per row r < rows of x [rows, d]: inv = 1 / sqrt(Σ_c x² / d + eps),
/// y = x inv · scale. One block a row.
cudaError_t launch_rms_norm_rows(bool f64, const void* x, const void* scale, void* y,
                                 std::int64_t rows, std::int64_t d, double eps,
                                 cudaStream_t stream);

/// The CPU's rms_norm_backward per row: with x̂ = x inv and gs = g · scale,
/// gx = inv (gs − x̂ Σ_c gs x̂ / d) (skipped when gx is null) and scale_rows = g · x̂. One block
/// a row.
cudaError_t launch_rms_norm_rows_backward(bool f64, const void* x, const void* scale, const void* g,
                                          void* gx, void* scale_rows, std::int64_t rows,
                                          std::int64_t d, double eps, cudaStream_t stream);

/// out[i, c] = Σ_{t < seq} x[i, t, c] for i < groups, c < d (x [groups, seq, d]), t ascending
/// (past 512 rows: in chunks of 256 rows, then the chunks' sums in order): per-sample sums
/// (groups = B) or totals (groups = 1).
cudaError_t launch_group_sums(bool f64, const void* x, std::int64_t groups, std::int64_t seq,
                              std::int64_t d, void* out, cudaStream_t stream);

/// The mse loss per row: row_loss[r] = Σ_c (out − y)², grad = 2 scale (out − y). One block a
/// row of `feat`.
cudaError_t launch_mse_rows(bool f64, const void* out, const void* y, std::int64_t rows,
                            std::int64_t feat, double scale, void* grad, void* row_loss,
                            cudaStream_t stream);

/// The cross entropy per row with classes `target` (i64, or i32 when !target_i64), each in
/// [0, feat): m = max, z = Σ exp(o − m), row_loss = log z + m − o_k, grad = scale (exp(o − m) / z
/// − [c = k]). One block a row.
cudaError_t launch_ce_rows(bool f64, const void* out, const void* target, bool target_i64,
                           std::int64_t rows, std::int64_t feat, double scale, void* grad,
                           void* row_loss, cudaStream_t stream);

/// y += alpha x, n elements.
cudaError_t launch_axpy(bool f64, void* y, const void* x, double alpha, std::int64_t n,
                        cudaStream_t stream);

}  // namespace meshtest::gpu::detail
