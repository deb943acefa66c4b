// linear: y = x Wᵀ + b with a PyTorch-layout weight, over any leading dims.
#pragma once

#include "src/core/tensor.hpp"

namespace meshtest {

/// y = x Wᵀ (+ b), like torch.nn.functional.linear.
///   x: [..., in], weight: [out, in], bias: [out]  ->  [..., out]
/// All tensors share one dtype (f32, f64 or bf16). bf16 computes in f32 (the weight is
/// converted a block of rows at a time) and rounds the output once, after the bias.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
/// y = x Wᵀ without bias.   x: [..., in], weight: [out, in]  ->  [..., out]
Tensor linear(const Tensor& x, const Tensor& weight);

}  // namespace meshtest
