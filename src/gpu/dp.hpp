// dp (GPU): the DP-SGD kernels of a Linear layer on DeviceTensors — the per-sample squared norms
// of its weight gradient by the ghost (input-length) and the direct (width) methods, of its bias
// gradient, and the book-keeping clipped sums — with the CPU ops' contracts (src/dp/norms.hpp,
// bookkeeping.hpp), f32 and f64, on cuBLAS (no TF32) and kernels of dp_kernel.cu, queued on
// blas.stream() and complete when they return (or queued only: Finish). Sums run in other orders
// than the CPU's: within the error model of docs/tolerances.md (tests/gpu/test_gpu_dp.cpp).
#pragma once

#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"

namespace meshtest::gpu::dp {

/// How a call here ends. complete (the default): once its work has finished; its outputs are
/// ordinary DeviceTensors. queued: once its work is queued on blas.stream(), its outputs
/// allocated in that stream's order (StreamOrdered) and complete only when the stream has run
/// that far — for a caller that queues its next work on the same stream and synchronizes it
/// before reading a result on the host or on another stream (the GPU model: dp_model.hpp).
/// Either way the call's scratch is allocated and freed in the stream's order.
enum class Finish { complete, queued };

/// Per-sample ‖G_iᵀA_i‖²_F by the ghost method: the Gram matrices A_i A_iᵀ and G_i G_iᵀ [T, T]
/// of a chunk of samples by two strided-batched GEMMs (chunks of at most 256 MiB of Grams), then
/// their inner product per sample; T = 1 (2-D inputs) is ‖a_i‖²‖g_i‖².
///   a: [B, d_in] or [B, T, d_in], g: [B, d_out] or [B, T, d_out], one dtype (f32, f64)  ->  [B]
/// Throws the CPU op's Errors (ranks, B or T that differ, dtypes), and for tensors on another
/// device than blas's.
DeviceTensor ghost_norm_sq(Blas& blas, const DeviceTensor& a, const DeviceTensor& g,
                           Finish finish = Finish::complete);

/// Per-sample ‖G_iᵀA_i‖²_F by the direct method: the per-sample weight gradients of a chunk of
/// samples by one strided-batched GEMM, then their sums of squares. With `weight_grad`
/// ([d_out, d_in], a's dtype, on the GPU) Σ_i G_iᵀA_i is added into it (one GEMM over all B·T
/// rows).   a, g as for ghost_norm_sq  ->  [B]
DeviceTensor direct_norm_sq(Blas& blas, const DeviceTensor& a, const DeviceTensor& g,
                            DeviceTensor* weight_grad = nullptr, Finish finish = Finish::complete);

/// Per-sample ‖Σ_t g_it‖² of the bias gradient.   g: [B, d_out] or [B, T, d_out]  ->  [B]
DeviceTensor bias_norm_sq(Blas& blas, const DeviceTensor& g, Finish finish = Finish::complete);

/// The book-keeping clipped weight gradient Σ_i c_i G_iᵀA_i = (diag(c) G)ᵀ A: the rows scaled,
/// then one GEMM over all B·T rows.   a, g as above, coef: [B]  ->  [d_out, d_in]
DeviceTensor clipped_weight_grad(Blas& blas, const DeviceTensor& a, const DeviceTensor& g,
                                 const DeviceTensor& coef, Finish finish = Finish::complete);

/// Σ_i c_i Σ_t g_it.   g: [B, d_out] or [B, T, d_out], coef: [B]  ->  [d_out]
DeviceTensor clipped_bias_grad(Blas& blas, const DeviceTensor& g, const DeviceTensor& coef,
                               Finish finish = Finish::complete);

/// The per-sample weight gradients G_iᵀA_i themselves (what the hooks mode instantiates), by
/// one strided-batched GEMM.   a, g as above  ->  [B, d_out, d_in]
DeviceTensor per_sample_weight_grads(Blas& blas, const DeviceTensor& a, const DeviceTensor& g,
                                     Finish finish = Finish::complete);

/// Queues row-major c [m, n] = op(a) · op(b) + beta c on blas.stream() in f32 (no TF32) or f64
/// (`f64`), op(a) [m, k] being a [m, k] or, with trans_a, the transpose of a [k, m] (b
/// likewise, [k, n] or [n, k]); device buffers of blas.device(), unchecked. Nothing for m or
/// n = 0; k = 0 gives beta c.
void gemm(Blas& blas, bool f64, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
          std::int64_t k, const void* a, const void* b, void* c, double beta = 0);

}  // namespace meshtest::gpu::dp
