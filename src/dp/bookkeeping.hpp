// Book-keeping clipping: the clipped gradient sum of a Linear layer from its kept A and G.
#pragma once

#include "src/core/tensor.hpp"

namespace meshtest::dp {

/// Σ_i c_i G_iᵀA_i = (diag(c) G)ᵀ A, one GEMM over all B·T rows.
///   a: [B, d_in] or [B, T, d_in], g: [B, d_out] or [B, T, d_out], coef: [B]  ->  [d_out, d_in]
/// One dtype (f32/f64) for all three; throws Error for mismatched B, T or dtype. `g` is taken by
/// value and scaled in place: move a G you no longer need into it to avoid a copy.
Tensor clipped_weight_grad(const Tensor& a, Tensor g, const Tensor& coef);

/// Σ_i c_i Σ_t g_it.   g: [B, d_out] or [B, T, d_out], coef: [B]  ->  [d_out]
Tensor clipped_bias_grad(const Tensor& g, const Tensor& coef);

/// Σ_i c_i x_i over the first dim: the clipped sum of instantiated per-sample gradients.
///   per_sample: [B, ...], coef: [B]  ->  [...]
Tensor clipped_sum(const Tensor& per_sample, const Tensor& coef);

/// Per-sample weight gradients G_iᵀA_i, one GEMM per sample into its slice of the output.
///   a: [B, (T,) d_in], g: [B, (T,) d_out]  ->  [B, d_out, d_in]
Tensor per_sample_weight_grads(const Tensor& a, const Tensor& g);
/// Per-sample bias gradients Σ_t g_it.   g: [B, (T,) d_out]  ->  [B, d_out]
Tensor per_sample_bias_grads(const Tensor& g);

/// Squared norm of each sample's slice.   per_sample: [B, ...]  ->  [B]
Tensor per_sample_norm_sq(const Tensor& per_sample);

}  // namespace meshtest::dp
