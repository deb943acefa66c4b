// The error model's counts for the gpt-oss blocks: the terms behind one output element and the
// bf16 roundings along the way (src/check/tolerance.hpp, docs/tolerances.md).
#pragma once

#include <cstdint>

#include "src/check/tolerance.hpp"
#include "src/models/gpt_oss_config.hpp"

namespace meshtest {

/// n and r of a chain of ops: `terms` added to make one output element over every reduction
/// of the chain, and `bf16_roundings`, the stages whose bf16-rounded output a later stage reads
/// in a bf16 run (the result's own rounding is not one). Where a sharded path rounds in more
/// places than the single device (a TP partial before its all_reduce), the count is the
/// sharded path's, the larger.
struct Chain {
  std::int64_t terms = 0;
  std::int64_t bf16_roundings = 0;

  /// The model of the chain's result in `dtype` (r = bf16_roundings for bf16, 0 for f32 and
  /// f64) against `reference`.
  ErrorModel model(DType dtype, Reference reference = Reference::other_order) const;
};

/// attention_block on `keys` keys per query at most, out's partials all_reduced over `tp`:
///   n: rms_norm (hidden), qkv (hidden + bias), q·k (head_dim), the softmax denominator (keys +
///      sink), p·v (keys), out (heads · head_dim + bias, then the all_reduce), the residual;
///   r: rms_norm, qkv, rope (two products and their sum), sdpa (logits, scaled logits, softmax
///      weights, output), out's partial and its all_reduce sum.
Chain attention_chain(const GptOssConfig& c, std::int64_t keys, int tp = 1);

/// The experts after the MLP norm (experts_reference, the fused experts), mlp2's partials
/// all_reduced over `tp`:
///   n: router logits (hidden + bias), mlp1 (hidden + bias), mlp2 (intermediate, then the
///      all_reduce), the combine of the k slots, each with its mlp2 bias;
///   r: router logits, softmax weights, mlp1's product and bias sum, swiglu (alpha·glu,
///      sigmoid, glu·sigmoid, lin + 1, their product), mlp2's partial and its all_reduce sum,
///      the combine's biased rows.
Chain experts_chain(std::int64_t hidden, std::int64_t intermediate, std::int64_t k, int tp = 1);
Chain experts_chain(const GptOssConfig& c, int tp = 1);

/// mlp_block: rms_norm (n: hidden; r: its output), the experts, their combined output (r: read
/// by the residual) and the residual (n: 1).
Chain mlp_chain(const GptOssConfig& c, int tp = 1);

/// transformer_block: the attention block, its output (r: read by the MLP block), the MLP
/// block.
Chain block_chain(const GptOssConfig& c, std::int64_t keys, int tp = 1);

/// The whole model on `tokens` tokens: the embedding (one row, all_reduced over tp when the
/// vocabulary is sharded), the blocks (each output read by the next or the final norm), the
/// final rms_norm (n: hidden; r: its output) and the unembedding (n: hidden).
Chain model_chain(const GptOssConfig& c, std::int64_t tokens, int tp = 1);

}  // namespace meshtest
