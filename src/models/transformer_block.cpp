// transformer_block: attention block then MLP block.
#include "src/models/transformer_block.hpp"

#include "src/ops/attention.hpp"
#include "src/ops/moe.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {

Tensor transformer_block(const Tensor& x, const BlockWeights& w, const GptOssConfig& c,
                         std::int64_t layer) {
  perf::OpScope scope("transformer_block");
  c.validate();
  MESHTEST_CHECK(x.rank() == 2 && x.shape()[1] == c.hidden_size,
                 "transformer_block: x has shape {}, expected [T, hidden_size = {}]", x.shape(),
                 c.hidden_size);
  check_block_weights(w, c, layer, x.dtype());
  const Tensor h = attention_block(x, w.attn, c.attention_params(layer));
  return mlp_block(h, w.mlp, c.moe_params());
}

}  // namespace meshtest
