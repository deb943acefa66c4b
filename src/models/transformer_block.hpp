// transformer_block: one gpt-oss layer, attention block then MLP block.
#pragma once

#include <cstdint>

#include "src/core/tensor.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"

namespace meshtest {

/// Layer `layer` of the model: mlp_block(attention_block(x)), with the sliding window on even
/// layers (c.layer_sliding_window).
///   x: [T, hidden]  ->  [T, hidden], x's dtype (the weights' dtype).
/// Throws Error for weights that do not fit c (named by checkpoint name) or a bad layer.
Tensor transformer_block(const Tensor& x, const BlockWeights& w, const GptOssConfig& c,
                         std::int64_t layer);

}  // namespace meshtest
