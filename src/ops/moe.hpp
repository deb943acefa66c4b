// moe: the gpt-oss MLP block — router (top-k, softmax over the k), SwiGLU experts, combine.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "src/core/tensor.hpp"
#include "src/ops/activations.hpp"
#include "src/ops/rms_norm.hpp"

namespace meshtest {

/// Options of the MLP block.
struct MoeParams {
  std::int64_t experts_per_token = 4;  ///< k
  double swiglu_alpha = kSwigluAlpha;
  double swiglu_limit = kSwigluLimit;
  double norm_eps = kRmsNormEps;
  /// Opt-in: the MLP blocks (mlp_block, tp_mlp_block) run the fused `experts` op (router,
  /// grouped GEMMs over each expert's tokens, weighted sum: src/ops/experts.hpp) in place of
  /// linear + route_top_k + moe_experts + moe_combine. Its results equal the sequence's (the
  /// same GEMMs and roundings). The expert-parallel block has its own dispatch and ignores it.
  bool fused = false;
};

/// Weights of one MLP block (checkpoint names block.{n}.mlp.*), all of one dtype except
/// norm_scale, which may be any floating dtype. Rows 2c and 2c+1 of mlp1 are the glu and linear
/// halves of intermediate unit c (interleaved).
struct MlpWeights {
  Tensor norm_scale;   ///< norm.scale   [hidden]
  Tensor gate_weight;  ///< gate.weight  [experts, hidden]
  Tensor gate_bias;    ///< gate.bias    [experts]
  Tensor mlp1_weight;  ///< mlp1_weight  [experts, 2 * intermediate, hidden]
  Tensor mlp1_bias;    ///< mlp1_bias    [experts, 2 * intermediate]
  Tensor mlp2_weight;  ///< mlp2_weight  [experts, hidden, intermediate]
  Tensor mlp2_bias;    ///< mlp2_bias    [experts, hidden]
};

/// Throws an Error naming the first weight whose shape or dtype does not fit the others,
/// `hidden` and `dtype`, or a k outside [1, experts].
void check_mlp(const MlpWeights& w, const MoeParams& p, std::int64_t hidden, DType dtype);

/// The router and expert weights of check_mlp (all but norm.scale), with `op` naming the op in
/// the Error: gate_weight [E, hidden], gate_bias [E], mlp1_weight [E, 2I, hidden], mlp1_bias
/// [E, 2I], mlp2_weight [E, hidden, I], mlp2_bias [E, hidden] (or, when `mlp2_bias_optional`,
/// an unset Tensor), all of `dtype`; p.experts_per_token in [1, E].
void check_moe_weights(std::string_view op, const Tensor& gate_weight, const Tensor& gate_bias,
                       const Tensor& mlp1_weight, const Tensor& mlp1_bias,
                       const Tensor& mlp2_weight, const Tensor& mlp2_bias, const MoeParams& p,
                       std::int64_t hidden, DType dtype, bool mlp2_bias_optional = false);

/// The router's choice for every token.
struct Routing {
  std::int64_t num_tokens = 0;
  std::int64_t k = 0;
  std::vector<std::int64_t> experts;  ///< [T * k]: token t's experts, highest logit first
  Tensor weights;                     ///< [T, k]: softmax over the k logits, logits' dtype
};

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

/// The MLP block: t = rms_norm(x); r = route_top_k(linear(t, gate), k);
///   out = x + moe_combine(moe_experts(t, r, mlp1, mlp2), r, mlp2_bias).
///   x: [T, hidden]  ->  [T, hidden], x's dtype (f32, f64 or bf16; weights of the same dtype).
Tensor mlp_block(const Tensor& x, const MlpWeights& w, const MoeParams& p);

}  // namespace meshtest
