// transformer: embedding, blocks, final norm, unembedding.
#include "src/models/transformer.hpp"

#include "src/models/transformer_block.hpp"
#include "src/ops/embedding.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/rms_norm.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {

Tensor transformer(std::span<const std::int64_t> tokens, const TransformerWeights& w,
                   const GptOssConfig& c, const TransformerOptions& options) {
  perf::OpScope scope("transformer");
  MESHTEST_CHECK(!tokens.empty(), "transformer: no tokens given (T = 0), expected T >= 1");
  check_transformer_weights(w, c);
  const std::int64_t layers = options.num_layers < 0 ? c.num_hidden_layers : options.num_layers;
  MESHTEST_CHECK(options.num_layers >= -1 && layers <= c.num_hidden_layers,
                 "transformer: num_layers is {}, expected -1 (all) or 0 .. {}", options.num_layers,
                 c.num_hidden_layers);
  Tensor x = embedding(tokens, w.embedding);
  for (std::int64_t n = 0; n < layers; ++n)
    x = transformer_block(x, w.blocks[n], c, n, {.fused = options.fused});
  return linear(rms_norm(x, w.norm_scale, c.norm_eps), w.unembedding);
}

}  // namespace meshtest
