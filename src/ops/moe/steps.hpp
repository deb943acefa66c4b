// moe/steps: the unfused steps of the gpt-oss MLP block after its norm — route_top_k,
// moe_experts, moe_combine — and the weight check the block and the fused experts op share.
#pragma once

#include <cstdint>
#include <string_view>

#include "src/core/tensor.hpp"
#include "src/ops/moe/types.hpp"

namespace meshtest {

/// The router and expert weights of check_mlp (all but norm.scale), with `op` naming the op in
/// the Error: gate_weight [E, hidden], gate_bias [E], mlp1_weight [E, 2I, hidden], mlp1_bias
/// [E, 2I], mlp2_weight [E, hidden, I], mlp2_bias [E, hidden] (or, when `mlp2_bias_optional`,
/// an unset Tensor), all of `dtype`; p.experts_per_token in [1, E].
void check_moe_weights(std::string_view op, const Tensor& gate_weight, const Tensor& gate_bias,
                       const Tensor& mlp1_weight, const Tensor& mlp1_bias,
                       const Tensor& mlp2_weight, const Tensor& mlp2_bias, const MoeParams& p,
                       std::int64_t hidden, DType dtype, bool mlp2_bias_optional = false);

/// Top-k of every row of the gate logits, sorted descending; equal logits are ordered by
/// expert index, lower first (deterministic, where torch.topk leaves ties unspecified); then
/// softmax over the k values (f32 for bf16, rounded to bf16).
///   logits: [T, experts]  ->  Routing with weights [T, k]
/// Throws Error for k outside [1, experts] or a NaN logit.
Routing route_top_k(const Tensor& logits, std::int64_t k);

/// Every token through its k experts, without the mlp2 bias (tensor parallel sums this over the
/// intermediate shards, then moe_combine adds the bias once):
///   y[t, j] = mlp2_weight[e] · swiglu(mlp1_weight[e] · t[t] + mlp1_bias[e]),  e = experts[t, j]
///   t: [T, hidden], mlp1_weight: [E, 2I, hidden], mlp1_bias: [E, 2I],
///   mlp2_weight: [E, hidden, I]  ->  [T, k, hidden]
/// Tokens are grouped by expert (one GEMM per expert). bf16 computes in f32 and rounds the
/// mlp1 product, its bias sum, each swiglu step and the mlp2 product, as the reference does.
Tensor moe_experts(const Tensor& t, const Routing& routing, const Tensor& mlp1_weight,
                   const Tensor& mlp1_bias, const Tensor& mlp2_weight, const MoeParams& p = {});

/// Adds each chosen expert's mlp2 bias and takes the routing-weighted sum over the k:
///   out[t] = Σ_j weights[t, j] · (y[t, j] + mlp2_bias[experts[t, j]])
///   y: [T, k, hidden], mlp2_bias: [E, hidden]  ->  [T, hidden]
Tensor moe_combine(const Tensor& y, const Routing& routing, const Tensor& mlp2_bias);

}  // namespace meshtest
