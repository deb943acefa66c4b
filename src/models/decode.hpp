// decode: the gpt-oss model step by step over a KV cache — a prefill fills each layer's keys and
// values (src/ops/kv_cache.hpp), later steps of one token (or a few) read them; a batch step
// appends one token to each of several sequences, each at its own position.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "src/core/tensor.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/models/transformer.hpp"
#include "src/ops/attention.hpp"
#include "src/ops/kv_cache.hpp"

namespace meshtest {

/// One KvCache per layer (keys after RoPE and values, [max_len, kv_heads, head_dim] each) and
/// the number of tokens seen: the next token's position.
struct ModelKvCache {
  /// Room for max_len positions in each of `num_layers` layers (-1: all of c's) of `dtype` (the
  /// weights' dtype), for `kv_heads` key/value heads (-1: all of c's; a tensor-parallel device
  /// holds its share). Throws Error for max_len < 1, num_layers outside [-1, c's layers],
  /// kv_heads outside [-1, c's] or a non-floating dtype.
  ModelKvCache(const GptOssConfig& c, std::int64_t max_len, DType dtype,
               std::int64_t num_layers = -1, std::int64_t kv_heads = -1);

  std::vector<KvCache> layers;
  std::int64_t length = 0;
};

/// The rows of a step that one sequence appends to its layer's cache: `rows` consecutive tokens
/// at positions first .. first + rows − 1.
struct CacheSegment {
  KvCache* cache = nullptr;
  std::int64_t first = 0;
  std::int64_t rows = 0;
};

/// Throws Error (naming `op` and the segment) unless there are segments, each with a cache of `kv_heads`
/// heads of `head_dim` in `dtype`, rows >= 1 at positions that fit it with no gap after its
/// written ones (first <= cache length), the caches are distinct, and the rows add up to
/// `rows`. Touches no cache.
void check_cache_segments(std::string_view op, std::span<const CacheSegment> segments,
                          std::int64_t kv_heads, std::int64_t head_dim, DType dtype,
                          std::int64_t rows);

/// attention_block over KV caches: x's rows are the segments' rows in order; each segment's
/// q, k and v at its positions, k and v written to its cache, then its queries over the
/// cache's keys 0 .. its last position (causal, p's sliding window). One segment on an empty
/// cache is attention_block bit for bit.
///   x: [sum of rows, hidden]  ->  same. Throws as attention_block and check_cache_segments do,
///   before any write.
Tensor cached_attention_block(const Tensor& x, const AttentionWeights& w, const AttentionParams& p,
                              std::span<const CacheSegment> segments);

/// Throws Error (naming `op`) before anything is touched unless every cache holds the same
/// number of layers (options.num_layers -1 or that number) of `kv_heads` heads in `dtype`, and
/// rows[i] more tokens fit caches[i]. Shared by the single-device and tensor-parallel steps.
void check_step_caches(std::string_view op, std::span<const ModelKvCache> caches,
                       std::span<const std::int64_t> rows, DType dtype, std::int64_t kv_heads,
                       const TransformerOptions& options);

/// Layer `layer`'s segments of a step whose rows[i] tokens go to caches[i], in order.
std::vector<CacheSegment> layer_segments(std::span<ModelKvCache> caches,
                                         std::span<const std::int64_t> rows, std::size_t layer);

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

/// Batch decode: tokens[i] appended to sequence i (caches[i], at position caches[i].length),
/// one row each: the norms, projections and MLP run on the batch, attention per sequence over
/// its own cache. Row i equals transformer_step of tokens[i] on caches[i] alone within the
/// error model of the chain (the batch's products may add in another order).
///   tokens: B >= 1 ids, caches: B  ->  logits [B, vocab]
/// Throws Error before touching any cache for B = 0, tokens and caches of different counts,
/// or what transformer_step rejects for any sequence.
Tensor transformer_decode(std::span<const std::int64_t> tokens, const TransformerWeights& w,
                          const GptOssConfig& c, std::span<ModelKvCache> caches,
                          const TransformerOptions& options = {});

}  // namespace meshtest
