// gelu (exact erf form, PyTorch's default) and relu, forward and backward.
#pragma once

#include "src/core/tensor.hpp"

namespace meshtest {

/// GELU, erf form: y = x Φ(x) = x (1 + erf(x / √2)) / 2.   x: any shape (f32/f64) -> same
Tensor gelu(const Tensor& x);
/// dL/dx of gelu: grad_out · (Φ(x) + x φ(x)).   x, grad_out: same shape and dtype -> same
Tensor gelu_backward(const Tensor& x, const Tensor& grad_out);

/// ReLU: y = max(x, 0).   x: any shape (f32/f64) -> same
Tensor relu(const Tensor& x);
/// dL/dx of relu: grad_out where x > 0, else 0.   x, grad_out: same shape and dtype -> same
Tensor relu_backward(const Tensor& x, const Tensor& grad_out);

}  // namespace meshtest
