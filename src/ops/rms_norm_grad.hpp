// rms_norm_backward: gradients of RMSNorm y = x r s, r = 1/sqrt(mean(x²) + eps), per row.
#pragma once

#include "src/core/tensor.hpp"
#include "src/ops/rms_norm.hpp"

namespace meshtest {

/// The gradients of rms_norm(x, scale, eps).
struct RmsNormGrads {
  Tensor input = {};       ///< [..., d]: r (g s − x̂ mean(g s x̂)), x̂ = x r
  Tensor scale_rows = {};  ///< [rows, d]: g x̂ for every row (sum the rows for the scale's gradient)
};

/// Backward of RMSNorm over the last dim, computed in the dtype of x (f32 or f64).
///   x: [..., d], scale: [d], grad_out: [..., d] (x's shape)  ->  RmsNormGrads
/// The per-row scale gradients let a caller sum them per sample (DP) or over all rows.
RmsNormGrads rms_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& grad_out,
                               double eps = kRmsNormEps);

}  // namespace meshtest
