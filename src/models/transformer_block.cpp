// transformer_block: attention block then MLP block.
#include "src/models/transformer_block.hpp"

#include "src/ops/attention.hpp"
#include "src/ops/moe/moe.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {

AttentionParams block_attention_params(const GptOssConfig& c, std::int64_t layer,
                                       const BlockOptions& options) {
  AttentionParams p = c.attention_params(layer);
  p.fused = options.fused;
  return p;
}

MoeParams block_moe_params(const GptOssConfig& c, const BlockOptions& options) {
  MoeParams p = c.moe_params();
  p.fused = options.fused;
  return p;
}

Tensor transformer_block(const Tensor& x, const BlockWeights& w, const GptOssConfig& c,
                         std::int64_t layer, const BlockOptions& options) {
  perf::OpScope scope("transformer_block");
  c.validate();
  MESHTEST_CHECK(x.rank() == 2 && x.shape()[1] == c.hidden_size,
                 "transformer_block: x has shape {}, expected [T, hidden_size = {}]", x.shape(),
                 c.hidden_size);
  check_block_weights(w, c, layer, x.dtype());
  const Tensor h = attention_block(x, w.attn, block_attention_params(c, layer, options));
  return mlp_block(h, w.mlp, block_moe_params(c, options));
}

}  // namespace meshtest
