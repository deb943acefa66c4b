// Element-wise ops of the reference blocks (the residual add, a bias added after a reduction).
#pragma once

#include "src/core/tensor.hpp"

namespace meshtest {

/// a + b element-wise (the residual connection).   a: [...], b: same shape  ->  same shape
/// Same dtype required; bf16 adds in f32 and rounds once.
Tensor add(const Tensor& a, const Tensor& b);

/// x + bias on every row (a Linear's bias added once, after a tensor-parallel all_reduce).
///   x: [..., n], bias: [n]  ->  x's shape
/// Same dtype required; bf16 adds in f32 and rounds once.
Tensor add_bias(const Tensor& x, const Tensor& bias);

}  // namespace meshtest
