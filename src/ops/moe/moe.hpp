// moe: the gpt-oss MLP block — router (top-k, softmax over the k), SwiGLU experts, combine.
// Its types are in types.hpp, its unfused steps in steps.hpp (both included here).
#pragma once

#include <cstdint>

#include "src/core/tensor.hpp"
#include "src/ops/moe/steps.hpp"
#include "src/ops/moe/types.hpp"

namespace meshtest {

/// Throws an Error naming the first weight whose shape or dtype does not fit the others,
/// `hidden` and `dtype`, or a k outside [1, experts].
void check_mlp(const MlpWeights& w, const MoeParams& p, std::int64_t hidden, DType dtype);

/// The MLP block: t = rms_norm(x); r = route_top_k(linear(t, gate), k);
///   out = x + moe_combine(moe_experts(t, r, mlp1, mlp2), r, mlp2_bias).
/// With p.fused, the fused experts op (src/ops/moe/experts.hpp) replaces the steps after the norm.
///   x: [T, hidden]  ->  [T, hidden], x's dtype (f32, f64 or bf16; weights of the same dtype).
Tensor mlp_block(const Tensor& x, const MlpWeights& w, const MoeParams& p);

}  // namespace meshtest
