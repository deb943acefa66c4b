// decode: the gpt-oss model step by step over a KV cache — a prefill fills each layer's keys and
// values (src/ops/kv_cache.hpp), later steps of one token (or a few) read them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "src/core/tensor.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/models/transformer.hpp"
#include "src/ops/kv_cache.hpp"

namespace meshtest {

/// One KvCache per layer (keys after RoPE and values, [max_len, kv_heads, head_dim] each) and
/// the number of tokens seen: the next token's position.
struct ModelKvCache {
  /// Room for max_len positions in each of `num_layers` layers (-1: all of c's) of `dtype` (the
  /// weights' dtype). Throws Error for max_len < 1, num_layers outside [-1, c's layers] or a
  /// non-floating dtype.
  ModelKvCache(const GptOssConfig& c, std::int64_t max_len, DType dtype,
               std::int64_t num_layers = -1);

  std::vector<KvCache> layers;
  std::int64_t length = 0;
};

/// One step of the model: `tokens` at positions cache.length .. cache.length + T - 1, each
/// attending to every cached token and to those before it in `tokens` (causal, the sliding
/// window on even layers), as in transformer() on the whole sequence so far; their keys and
/// values are written to the cache. A prefill is a step on an empty cache (transformer() bit for
/// bit); decode is a step of one token. options.fused as in transformer(); the cache's layer
/// count is the step's (options.num_layers must be -1 or equal it).
///   tokens: T >= 1 ids in [0, vocab)  ->  logits [T, vocab] of those tokens, the weights' dtype
/// Throws Error before touching the cache for T = 0, an id outside [0, vocab), weights that do
/// not fit c, a cache of another dtype or depth, or positions past its max_len.
Tensor transformer_step(std::span<const std::int64_t> tokens, const TransformerWeights& w,
                        const GptOssConfig& c, ModelKvCache& cache,
                        const TransformerOptions& options = {});

}  // namespace meshtest
