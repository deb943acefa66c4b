// transformer: the gpt-oss model, token ids to logits of every position.
#pragma once

#include <cstdint>
#include <span>

#include "src/core/tensor.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"

namespace meshtest {

/// Options of transformer().
struct TransformerOptions {
  std::int64_t num_layers = -1;  ///< run only the first n blocks; -1: all
  bool fused = false;            ///< the blocks' fused ops (BlockOptions::fused); off by default
};

/// The model: x = embedding(tokens); x = transformer_block(x, n) for every layer n;
/// logits = linear(rms_norm(x, norm.scale), unembedding) (no bias).
///   tokens: T >= 1 ids in [0, vocab)  ->  logits [T, vocab], the weights' dtype
/// Throws Error for T = 0, an id outside [0, vocab), weights that do not fit c (named by
/// checkpoint name) or num_layers outside [-1, num_hidden_layers].
Tensor transformer(std::span<const std::int64_t> tokens, const TransformerWeights& w,
                   const GptOssConfig& c, const TransformerOptions& options = {});

}  // namespace meshtest
