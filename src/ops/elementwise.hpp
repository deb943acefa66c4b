// Element-wise ops of the reference blocks (the residual add).
#pragma once

#include "src/core/tensor.hpp"

namespace meshtest {

/// a + b element-wise (the residual connection).   a: [...], b: same shape  ->  same shape
/// Same dtype required; bf16 adds in f32 and rounds once.
Tensor add(const Tensor& a, const Tensor& b);

}  // namespace meshtest
