// linear_backward: the gradients of y = x Wᵀ + b with respect to x, W and b.
#pragma once

#include "src/core/tensor.hpp"

namespace meshtest {

/// Which gradients linear_backward computes (the others are left empty).
struct LinearBackwardOptions {
  bool input = true;   ///< grad_input = grad_out W
  bool weight = true;  ///< grad_weight = grad_outᵀ x over all rows
  bool bias = true;    ///< grad_bias = Σ_rows grad_out
};

/// The gradients of linear(x, W, b).
struct LinearGrads {
  Tensor input = {};   ///< [..., in]
  Tensor weight = {};  ///< [out, in]
  Tensor bias = {};    ///< [out]
};

/// Backward of y = x Wᵀ + b, summed over every leading row of x (2-D [B, in] or 3-D
/// [B, T, in] inputs alike).
///   x: [..., in], weight: [out, in], grad_out: [..., out] (same leading dims as x)
/// f32 or f64, all tensors of one dtype; throws Error for shape or dtype mismatches.
LinearGrads linear_backward(const Tensor& x, const Tensor& weight, const Tensor& grad_out,
                            const LinearBackwardOptions& opt = {});

}  // namespace meshtest
