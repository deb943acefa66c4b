// decode: transformer_step and transformer_decode — per layer the attention block over the
// step's cache segments, then the MLP block on every row.
#include "src/models/decode.hpp"

#include <numeric>
#include <string>

#include "src/models/transformer_block.hpp"
#include "src/ops/elementwise.hpp"
#include "src/ops/embedding.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/moe/moe.hpp"
#include "src/ops/rms_norm.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

std::vector<std::int64_t> positions_of(const CacheSegment& s) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(s.rows));
  std::iota(p.begin(), p.end(), s.first);
  return p;
}

/// The model over caches[i] receiving rows[i] of `tokens` each (in order): embedding, the
/// blocks over the layers' segments, the final norm and unembedding; the caches' lengths
/// advance. The callers check the counts.
Tensor step_over(std::string_view op, std::span<const std::int64_t> tokens,
                 const TransformerWeights& w, const GptOssConfig& c, std::span<ModelKvCache> caches,
                 std::span<const std::int64_t> rows, const TransformerOptions& options) {
  check_transformer_weights(w, c);
  check_step_caches(op, caches, rows, w.embedding.dtype(), c.num_key_value_heads, options);
  Tensor x = embedding(tokens, w.embedding);  // checks the ids before any write
  const std::size_t layers = caches.front().layers.size();
  const BlockOptions block{.fused = options.fused};
  for (std::size_t i = 0; i < layers; ++i) {
    const auto n = static_cast<std::int64_t>(i);
    check_block_weights(w.blocks[i], c, n, x.dtype());
    const Tensor h = cached_attention_block(
        x, w.blocks[i].attn, block_attention_params(c, n, block), layer_segments(caches, rows, i));
    x = mlp_block(h, w.blocks[i].mlp, block_moe_params(c, block));
  }
  for (std::size_t i = 0; i < caches.size(); ++i) caches[i].length += rows[i];
  return linear(rms_norm(x, w.norm_scale, c.norm_eps), w.unembedding);
}

}  // namespace

ModelKvCache::ModelKvCache(const GptOssConfig& c, std::int64_t max_len, DType dtype,
                           std::int64_t num_layers, std::int64_t kv_heads) {
  MESHTEST_CHECK(num_layers >= -1 && num_layers <= c.num_hidden_layers,
                 "ModelKvCache: num_layers is {}, expected -1 (all) or 0 .. {}", num_layers,
                 c.num_hidden_layers);
  MESHTEST_CHECK(kv_heads == -1 || (kv_heads >= 1 && kv_heads <= c.num_key_value_heads),
                 "ModelKvCache: kv_heads is {}, expected -1 (all) or 1 .. {}", kv_heads,
                 c.num_key_value_heads);
  const std::int64_t n = num_layers < 0 ? c.num_hidden_layers : num_layers;
  const std::int64_t heads = kv_heads < 0 ? c.num_key_value_heads : kv_heads;
  for (std::int64_t i = 0; i < n; ++i) layers.emplace_back(max_len, heads, c.head_dim, dtype);
}

void check_cache_segments(std::string_view op, std::span<const CacheSegment> segments,
                          std::int64_t kv_heads, std::int64_t head_dim, DType dtype,
                          std::int64_t rows) {
  MESHTEST_CHECK(!segments.empty(), "{}: no segments given, expected one per sequence", op);
  std::int64_t total = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const CacheSegment& s = segments[i];
    MESHTEST_CHECK(s.cache != nullptr, "{}: segment {} has no cache", op, i);
    const KvCache& kv = *s.cache;
    MESHTEST_CHECK(kv.kv_heads() == kv_heads && kv.head_dim() == head_dim && kv.dtype() == dtype,
                   "{}: segment {}'s cache holds {} kv heads of {} in {}, expected {} of {} in {}",
                   op, i, kv.kv_heads(), kv.head_dim(), kv.dtype(), kv_heads, head_dim, dtype);
    MESHTEST_CHECK(s.rows >= 1 && s.first >= 0 && s.first <= kv.length(),
                   "{}: segment {} has {} rows at position {}, expected >= 1 rows from a "
                   "position in [0, {}] (no gap after the cache's written positions)",
                   op, i, s.rows, s.first, kv.length());
    MESHTEST_CHECK(s.first + s.rows <= kv.max_len(),
                   "{}: segment {}'s positions {} .. {} do not fit its cache's {} positions", op, i,
                   s.first, s.first + s.rows - 1, kv.max_len());
    for (std::size_t j = 0; j < i; ++j) {
      MESHTEST_CHECK(segments[j].cache != s.cache, "{}: segments {} and {} share a cache", op, j,
                     i);
    }
    total += s.rows;
  }
  MESHTEST_CHECK(total == rows, "{}: the segments hold {} rows, x has {}", op, total, rows);
}

Tensor cached_attention_block(const Tensor& x, const AttentionWeights& w, const AttentionParams& p,
                              std::span<const CacheSegment> segments) {
  perf::OpScope scope("attention_block");
  MESHTEST_CHECK(x.rank() == 2, "cached_attention_block: x has shape {}, expected [T, hidden]",
                 x.shape());
  check_attention(w, p, x.shape()[1], x.dtype());
  check_cache_segments("cached_attention_block", segments, p.num_kv_heads, p.head_dim, x.dtype(),
                       x.shape()[0]);
  const Tensor t = rms_norm(x, w.norm_scale, p.norm_eps);
  std::vector<Tensor> parts;
  std::int64_t row = 0;
  for (const CacheSegment& s : segments) {
    const Qkv qkv =
        attention_qkv(segments.size() == 1 ? t : t.slice(0, row, s.rows), w, p, s.first);
    s.cache->write(qkv.k, qkv.v, positions_of(s));
    const std::int64_t end = s.first + s.rows;
    parts.push_back(
        attention_sdpa(qkv.q, s.cache->keys(0, end), s.cache->values(0, end), w.sinks, p, s.first));
    row += s.rows;
  }
  const Tensor attn = parts.size() == 1 ? parts.front() : concat(parts, 0);
  return add(x, linear(attn, w.out_weight, w.out_bias));
}

void check_step_caches(std::string_view op, std::span<const ModelKvCache> caches,
                       std::span<const std::int64_t> rows, DType dtype, std::int64_t kv_heads,
                       const TransformerOptions& options) {
  MESHTEST_CHECK(!caches.empty() && caches.size() == rows.size(),
                 "{}: {} caches for {} sequences, expected one per sequence (>= 1)", op,
                 caches.size(), rows.size());
  const auto layers = static_cast<std::int64_t>(caches.front().layers.size());
  MESHTEST_CHECK(options.num_layers == -1 || options.num_layers == layers,
                 "{}: the cache holds {} layers, but num_layers is {}", op, layers,
                 options.num_layers);
  for (std::size_t i = 0; i < caches.size(); ++i) {
    const ModelKvCache& m = caches[i];
    const std::string which = caches.size() == 1 ? "" : fmt::format(" (sequence {})", i);
    MESHTEST_CHECK(static_cast<std::int64_t>(m.layers.size()) == layers,
                   "{}: the cache{} holds {} layers, the first {}", op, which, m.layers.size(),
                   layers);
    if (layers == 0) continue;
    const KvCache& first = m.layers.front();
    MESHTEST_CHECK(first.dtype() == dtype, "{}: the cache{} is {}, the weights {}", op, which,
                   first.dtype(), dtype);
    MESHTEST_CHECK(first.kv_heads() == kv_heads, "{}: the cache{} holds {} kv heads, expected {}",
                   op, which, first.kv_heads(), kv_heads);
    MESHTEST_CHECK(m.length + rows[i] <= first.max_len(),
                   "{}: {} tokens after {} cached do not fit the cache's{} {} positions", op,
                   rows[i], m.length, which, first.max_len());
  }
}

std::vector<CacheSegment> layer_segments(std::span<ModelKvCache> caches,
                                         std::span<const std::int64_t> rows, std::size_t layer) {
  std::vector<CacheSegment> segments;
  for (std::size_t i = 0; i < caches.size(); ++i) {
    segments.push_back(
        {.cache = &caches[i].layers[layer], .first = caches[i].length, .rows = rows[i]});
  }
  return segments;
}

Tensor transformer_step(std::span<const std::int64_t> tokens, const TransformerWeights& w,
                        const GptOssConfig& c, ModelKvCache& cache,
                        const TransformerOptions& options) {
  perf::OpScope scope("transformer_step");
  MESHTEST_CHECK(!tokens.empty(), "transformer_step: no tokens given (T = 0), expected T >= 1");
  const std::int64_t rows = static_cast<std::int64_t>(tokens.size());
  return step_over("transformer_step", tokens, w, c, std::span(&cache, 1), std::span(&rows, 1),
                   options);
}

Tensor transformer_decode(std::span<const std::int64_t> tokens, const TransformerWeights& w,
                          const GptOssConfig& c, std::span<ModelKvCache> caches,
                          const TransformerOptions& options) {
  perf::OpScope scope("transformer_decode");
  MESHTEST_CHECK(!tokens.empty() && tokens.size() == caches.size(),
                 "transformer_decode: {} tokens for {} caches, expected one token per cache "
                 "(>= 1)",
                 tokens.size(), caches.size());
  const std::vector<std::int64_t> rows(tokens.size(), 1);
  return step_over("transformer_decode", tokens, w, c, caches, rows, options);
}

}  // namespace meshtest
