// transformer_block: one gpt-oss layer, attention block then MLP block.
#pragma once

#include <cstdint>

#include "src/core/tensor.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/ops/attention.hpp"
#include "src/ops/moe/moe.hpp"

namespace meshtest {

/// Options of a block that do not come from the model's config.
struct BlockOptions {
  /// Opt-in: the block's fused ops in place of their unfused sequences (off: the reference
  /// numerics): qkv_rope and sdpa_sinks in the attention block (AttentionParams::fused) and
  /// experts in the MLP block (MoeParams::fused; not in the expert-parallel MLP block).
  bool fused = false;
};

/// c.attention_params(layer) with options.fused: what every gpt-oss block (single device, TP,
/// EP) passes to its attention block.
AttentionParams block_attention_params(const GptOssConfig& c, std::int64_t layer,
                                       const BlockOptions& options);
/// c.moe_params() with options.fused: what every gpt-oss block passes to its MLP block.
MoeParams block_moe_params(const GptOssConfig& c, const BlockOptions& options);

/// Layer `layer` of the model: mlp_block(attention_block(x)), with the sliding window on even
/// layers (c.layer_sliding_window) and the fused ops when options.fused.
///   x: [T, hidden]  ->  [T, hidden], x's dtype (the weights' dtype).
/// Throws Error for weights that do not fit c (named by checkpoint name) or a bad layer.
Tensor transformer_block(const Tensor& x, const BlockWeights& w, const GptOssConfig& c,
                         std::int64_t layer, const BlockOptions& options = {});

}  // namespace meshtest
