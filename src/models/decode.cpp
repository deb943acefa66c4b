// decode: transformer_step — per layer the attention block over its KvCache, then the MLP block.
#include "src/models/decode.hpp"

#include <numeric>

#include "src/models/transformer_block.hpp"
#include "src/ops/attention.hpp"
#include "src/ops/elementwise.hpp"
#include "src/ops/embedding.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/moe/moe.hpp"
#include "src/ops/rms_norm.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

/// attention_block for tokens at `positions` (consecutive, from positions[0]): their q, k and v,
/// k and v written to the layer's cache, then the queries over every cached key so far.
Tensor cached_attention_block(const Tensor& x, const AttentionWeights& w, const AttentionParams& p,
                              KvCache& cache, std::span<const std::int64_t> positions) {
  perf::OpScope scope("attention_block");
  check_attention(w, p, x.shape()[1], x.dtype());
  const std::int64_t offset = positions.front(), end = positions.back() + 1;
  const Tensor t = rms_norm(x, w.norm_scale, p.norm_eps);
  const Qkv qkv = attention_qkv(t, w, p, offset);
  cache.write(qkv.k, qkv.v, positions);
  const Tensor attn =
      attention_sdpa(qkv.q, cache.keys(0, end), cache.values(0, end), w.sinks, p, offset);
  return add(x, linear(attn, w.out_weight, w.out_bias));
}

}  // namespace

ModelKvCache::ModelKvCache(const GptOssConfig& c, std::int64_t max_len, DType dtype,
                           std::int64_t num_layers) {
  MESHTEST_CHECK(num_layers >= -1 && num_layers <= c.num_hidden_layers,
                 "ModelKvCache: num_layers is {}, expected -1 (all) or 0 .. {}", num_layers,
                 c.num_hidden_layers);
  const std::int64_t n = num_layers < 0 ? c.num_hidden_layers : num_layers;
  for (std::int64_t i = 0; i < n; ++i) {
    layers.emplace_back(max_len, c.num_key_value_heads, c.head_dim, dtype);
  }
}

Tensor transformer_step(std::span<const std::int64_t> tokens, const TransformerWeights& w,
                        const GptOssConfig& c, ModelKvCache& cache,
                        const TransformerOptions& options) {
  perf::OpScope scope("transformer_step");
  MESHTEST_CHECK(!tokens.empty(), "transformer_step: no tokens given (T = 0), expected T >= 1");
  check_transformer_weights(w, c);
  const auto layers = static_cast<std::int64_t>(cache.layers.size());
  MESHTEST_CHECK(options.num_layers == -1 || options.num_layers == layers,
                 "transformer_step: the cache holds {} layers, but num_layers is {}", layers,
                 options.num_layers);
  const auto t = static_cast<std::int64_t>(tokens.size());
  if (layers > 0) {
    const KvCache& first = cache.layers.front();
    MESHTEST_CHECK(first.dtype() == w.embedding.dtype(),
                   "transformer_step: the cache is {}, the weights {}", first.dtype(),
                   w.embedding.dtype());
    MESHTEST_CHECK(
        cache.length + t <= first.max_len(),
        "transformer_step: {} tokens after {} cached do not fit the cache's {} positions", t,
        cache.length, first.max_len());
  }
  Tensor x = embedding(tokens, w.embedding);  // checks the ids before any write
  std::vector<std::int64_t> positions(tokens.size());
  std::iota(positions.begin(), positions.end(), cache.length);
  const BlockOptions block{.fused = options.fused};
  for (std::int64_t n = 0; n < layers; ++n) {
    const auto i = static_cast<std::size_t>(n);
    check_block_weights(w.blocks[i], c, n, x.dtype());
    const Tensor h = cached_attention_block(
        x, w.blocks[i].attn, block_attention_params(c, n, block), cache.layers[i], positions);
    x = mlp_block(h, w.blocks[i].mlp, block_moe_params(c, block));
  }
  cache.length += t;
  return linear(rms_norm(x, w.norm_scale, c.norm_eps), w.unembedding);
}

}  // namespace meshtest
