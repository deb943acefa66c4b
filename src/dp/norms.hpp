// Per-sample squared gradient norms of a Linear layer: ghost (Gram) and direct (width).
//
// Sample i of a Linear layer has activations A_i [T, d_in] and output grads G_i [T, d_out]; its
// weight gradient is G_iᵀ A_i [d_out, d_in] and its bias gradient G_iᵀ 1 [d_out].
#pragma once

#include <cstdint>

#include "src/core/tensor.hpp"

namespace meshtest::dp {

/// How a layer computes ‖G_iᵀA_i‖²_F.
enum class NormMethod {
  ghost,   ///< <A_i A_iᵀ, G_i G_iᵀ>: about 2BT²(d_in + d_out) flops, T x T tiles
  direct,  ///< A_iᵀG_i tile by tile, squares summed: about 2BT d_in d_out flops
};

/// "ghost" or "direct".
const char* norm_method_name(NormMethod m);

/// The hybrid rule: ghost when 2T² <= d_in·d_out, else direct.
NormMethod hybrid_method(std::int64_t seq, std::int64_t d_in, std::int64_t d_out);

/// Per-sample ‖G_iᵀA_i‖²_F by the ghost (input-length) method; T = 1 is ‖a_i‖²‖g_i‖².
///   a: [B, d_in] or [B, T, d_in], g: [B, d_out] or [B, T, d_out], one dtype (f32/f64) -> [B]
Tensor ghost_norm_sq(const Tensor& a, const Tensor& g);

/// Per-sample ‖G_iᵀA_i‖²_F by the direct (width) method: each sample's A_iᵀG_i is built one
/// tile of the weight at a time (never B x d_out x d_in). With `weight_grad` (shape
/// [d_out, d_in], a's dtype) the same tiles are also added into it: the weight-gradient pass
/// Σ_i G_iᵀA_i fused with the norms.   a, g as for ghost_norm_sq -> [B]
Tensor direct_norm_sq(const Tensor& a, const Tensor& g, Tensor* weight_grad = nullptr);

/// Per-sample ‖G_iᵀ1‖² of the bias gradient.   g: [B, d_out] or [B, T, d_out] -> [B]
Tensor bias_norm_sq(const Tensor& g);

/// Per-sample norms from summed squared norms: sqrt(max(sq, 0)).   sq: [B] -> [B]
Tensor norms_from_squares(const Tensor& sq);

}  // namespace meshtest::dp
