// moe/types: the gpt-oss MLP block's options, weights and routing, shared by the block (moe),
// its unfused steps (steps.hpp), the fused experts op and the MoE helpers below the block.
#pragma once

#include <cstdint>
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
  /// grouped GEMMs over each expert's tokens, weighted sum: src/ops/moe/experts.hpp) in place of
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

/// The router's choice for every token.
struct Routing {
  std::int64_t num_tokens = 0;
  std::int64_t k = 0;
  std::vector<std::int64_t> experts;  ///< [T * k]: token t's experts, highest logit first
  Tensor weights;                     ///< [T, k]: softmax over the k logits, logits' dtype
};

}  // namespace meshtest
