// moe/gating: the router's choice of k experts per token, in the two orders used by MoE models.
#pragma once

#include <cstdint>

#include "src/core/tensor.hpp"
#include "src/ops/moe/moe.hpp"

namespace meshtest {

/// Where the softmax sits relative to the top-k.
enum class GatingOrder {
  TopKThenSoftmax,  ///< gpt-oss, Mixtral: top-k of the logits, softmax over those k values
  SoftmaxThenTopK,  ///< Switch, GShard, DeepSeek: softmax over all experts, then the top-k probs
};

/// Options of gate().
struct GatingOptions {
  GatingOrder order = GatingOrder::TopKThenSoftmax;
  /// SoftmaxThenTopK only: divide the k chosen probabilities by their sum (so each token's
  /// weights sum to 1). Ignored by TopKThenSoftmax, whose weights always sum to 1.
  bool renormalize = true;
};

/// The router: for each row of the logits, the k experts with the largest logits in descending
/// order, equal logits ordered by expert id (lower first, so ties never depend on the sort), and
/// their weights by `o.order`. TopKThenSoftmax equals route_top_k (src/ops/moe/steps.hpp).
///   logits: [T, E] (f32, f64 or bf16; bf16 computes in f32 and rounds the weights once)
///   -> Routing{T, k, experts [T*k], weights [T, k] in the logits' dtype}
/// T = 0 is legal (an empty routing). Throws Error for k outside [1, E] or a NaN logit
/// (named by token and expert).
Routing gate(const Tensor& logits, std::int64_t k, const GatingOptions& o = {});

/// Softmax over every row of the logits (the router probabilities P of the auxiliary loss),
/// computed in f64 for f64 and f32 otherwise, returned as f32 (f64 for f64).
///   logits: [T, E] -> [T, E]
/// Throws Error for logits that are not a floating [T, E] or hold a NaN.
Tensor router_probabilities(const Tensor& logits);

}  // namespace meshtest
