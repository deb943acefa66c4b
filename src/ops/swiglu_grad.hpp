// swiglu_grad: SiLU and the gpt-oss clamped SwiGLU (activations.hpp), fused, with backward.
#pragma once

#include "src/core/tensor.hpp"
#include "src/ops/activations.hpp"

namespace meshtest {

/// silu(x) = x · σ(x), elementwise, any shape. f32, f64 or bf16 (bf16: f32 inside, one rounding);
/// throws Error for any other dtype.
Tensor silu(const Tensor& x);
/// d silu / dx · grad_out = grad_out · σ(x) · (1 + x · (1 − σ(x))), elementwise, any shape.
/// f32 or f64; throws Error unless grad_out has x's shape and dtype.
Tensor silu_backward(const Tensor& x, const Tensor& grad_out);

/// The backward of swiglu(x, alpha, limit) on interleaved columns (x: [..., 2I],
/// grad_out: [..., I] -> grad_x [..., 2I]). With g = min(x_glu, limit) and
/// l = clamp(x_lin, −limit, limit), out = g·σ(αg)·(l + 1):
///   d/dx_glu = (l + 1)·σ(αg)·(1 + αg·(1 − σ(αg)))  where x_glu <= limit, else 0;
///   d/dx_lin = g·σ(αg)                              where |x_lin| <= limit, else 0.
/// Strictly beyond the clamp the gradient is 0; at the boundary itself it passes (torch's clamp
/// backward takes the subgradient 1 there, so this matches autograd on the reference model).
/// f32 or f64, grad_out of x's dtype; throws Error for an odd last dim, a grad_out of the wrong
/// shape or dtype, a non-finite alpha or a limit that is not finite and > 0.
Tensor swiglu_backward(const Tensor& x, const Tensor& grad_out, double alpha = kSwigluAlpha,
                       double limit = kSwigluLimit);

}  // namespace meshtest
