// gpt-oss weights: per-block and whole-model structs, constant and seeded random init.
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "src/core/random.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/ops/attention.hpp"
#include "src/ops/moe/moe.hpp"

namespace meshtest {

/// Weights of one transformer block (checkpoint prefix block.{n}).
struct BlockWeights {
  AttentionWeights attn;  ///< block.{n}.attn.*
  MlpWeights mlp;         ///< block.{n}.mlp.*
};

/// Weights of the whole model. One dtype (f32, f64 or bf16) for all tensors, except the norm
/// scales, which may be any floating dtype; bf16 computes in f32.
struct TransformerWeights {
  Tensor embedding;  ///< embedding.weight   [vocab, hidden]
  std::vector<BlockWeights> blocks;
  Tensor norm_scale;   ///< norm.scale         [hidden]
  Tensor unembedding;  ///< unembedding.weight [vocab, hidden]

  /// The activation dtype: the embedding's.
  DType dtype() const { return embedding.dtype(); }
};

/// Every element = value (the constant-init test pattern; 0.5 by default).
struct ConstantInit {
  double value = 0.5;
};
/// Seeded counter-based random values: norm scales U[0.5, 1.5), weights [out, in]
/// N(0, 1/in), biases N(0, 0.1²), sinks and embedding N(0, 1). Tensor i of layer n uses
/// RandomKey{seed, (n + 1) * 64 + i}; the model-level tensors use streams 0..2. Values are drawn
/// in f64 and rounded to the dtype, so f32 and f64 weights of one seed differ by rounding only.
struct RandomInit {
  std::uint64_t seed = 0;
};
using WeightInit = std::variant<ConstantInit, RandomInit>;

/// Weights of the attention block of layer `layer`, of `dtype`.
AttentionWeights init_attention_weights(const GptOssConfig& c, std::int64_t layer, DType dtype,
                                        const WeightInit& init);
/// Weights of the MLP block of layer `layer`, of `dtype`.
MlpWeights init_mlp_weights(const GptOssConfig& c, std::int64_t layer, DType dtype,
                            const WeightInit& init);
/// Both blocks of layer `layer`.
BlockWeights init_block_weights(const GptOssConfig& c, std::int64_t layer, DType dtype,
                                const WeightInit& init);
/// The whole model (c.num_hidden_layers blocks).
TransformerWeights init_transformer_weights(const GptOssConfig& c, DType dtype,
                                            const WeightInit& init);

/// Every tensor converted to `dtype` (norm scales too).
BlockWeights astype(const BlockWeights& w, DType dtype);
TransformerWeights astype(const TransformerWeights& w, DType dtype);

/// Throws Error naming the first tensor (by checkpoint name, e.g. block.1.mlp.mlp1_weight) whose
/// shape or dtype does not fit `c`, or a block count different from c.num_hidden_layers.
void check_block_weights(const BlockWeights& w, const GptOssConfig& c, std::int64_t layer,
                         DType dtype);
void check_transformer_weights(const TransformerWeights& w, const GptOssConfig& c);

}  // namespace meshtest
