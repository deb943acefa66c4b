// swiglu_grad: SiLU and the gpt-oss clamped SwiGLU (activations.hpp), fused, with backward.
#pragma once

#include "src/core/tensor.hpp"
#include "src/ops/activations.hpp"

namespace meshtest {

/// silu(x) = x · σ(x), elementwise, any shape. f32, f64 or bf16 (bf16: f32 inside, one rounding).
Tensor silu(const Tensor& x);
/// d silu / dx · grad_out = grad_out · σ(x) · (1 + x · (1 − σ(x))).   f32 or f64.
Tensor silu_backward(const Tensor& x, const Tensor& grad_out);

/// The backward of swiglu(x, alpha, limit) on interleaved columns (x: [..., 2I],
/// grad_out: [..., I] -> grad_x [..., 2I]). With g = min(x_glu, limit) and
/// l = clamp(x_lin, −limit, limit), out = g·σ(αg)·(l + 1):
///   d/dx_glu = (l + 1)·σ(αg)·(1 + αg·(1 − σ(αg)))  where x_glu < limit, else 0;
///   d/dx_lin = g·σ(αg)                              where |x_lin| < limit, else 0.
/// (At the clamp boundary itself the gradient is 0, as torch's clamp gives.) f32 or f64.
Tensor swiglu_backward(const Tensor& x, const Tensor& grad_out, double alpha = kSwigluAlpha,
                       double limit = kSwigluLimit);

}  // namespace meshtest
