// tp_decode: the TP attention block over cache segments, and the model's steps around it
// (tp_transformer_with's embedding, token split and unembedding).
#include "dist/parallel/tp_decode.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "dist/ccl/all_gather.hpp"
#include "dist/ccl/all_reduce.hpp"
#include "dist/mesh/agree.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/ops/elementwise.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/rms_norm.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dist {
namespace {

std::int64_t total_rows(std::span<const CacheSegment> segments) {
  std::int64_t n = 0;
  for (const CacheSegment& s : segments) n += s.rows;
  return n;
}

/// This device's part of segment `segment` (maybe no rows): its first position and queries.
struct Piece {
  std::size_t segment = 0;
  std::int64_t first = 0;
  Tensor q;
};

/// `parts` (one or more) joined on dim 0.
Tensor join_rows(const std::vector<Tensor>& parts) {
  return parts.size() == 1 ? parts.front() : concat(parts, 0);
}

/// The model over caches[i] receiving rows[i] of `tokens` each, on the mesh.
Tensor tp_step_over(std::string_view op, const MeshDevice& mesh,
                    std::span<const std::int64_t> tokens, const TpTransformerWeights& w,
                    const GptOssConfig& c, std::span<ModelKvCache> caches,
                    std::span<const std::int64_t> rows, const TransformerOptions& options,
                    const TpOptions& o) {
  token_axis(o);
  const int tp = mesh.axis_size(o.tp_axis);
  check_tp_config(c, tp);
  check_and_agree(mesh.comm(), "", [&] {
    check_step_caches(op, caches, rows, w.embedding.dtype(), c.num_key_value_heads / tp, options);
  });
  TransformerOptions run = options;
  run.num_layers = static_cast<std::int64_t>(caches.front().layers.size());
  Tensor logits =
      tp_transformer_with(mesh, tokens, w, static_cast<std::int64_t>(w.blocks.size()), c, run, o,
                          [&](const Tensor& x, std::int64_t n, std::int64_t) {
                            const auto i = static_cast<std::size_t>(n);
                            return tp_transformer_block_cached(mesh, x, w.blocks[i], c, n,
                                                               layer_segments(caches, rows, i), o,
                                                               {.fused = options.fused});
                          });
  for (std::size_t i = 0; i < caches.size(); ++i) caches[i].length += rows[i];
  return logits;
}

}  // namespace

ModelKvCache tp_kv_cache(const MeshDevice& mesh, const GptOssConfig& c, std::int64_t max_len,
                         DType dtype, const TpOptions& o, std::int64_t num_layers) {
  token_axis(o);
  const int tp = mesh.axis_size(o.tp_axis);
  check_tp_config(c, tp);
  return ModelKvCache(c, max_len, dtype, num_layers, c.num_key_value_heads / tp);
}

Tensor tp_cached_attention_block(const MeshDevice& mesh, const Tensor& x, const AttentionWeights& w,
                                 const AttentionParams& p, std::span<const CacheSegment> segments,
                                 const TpOptions& o) {
  perf::OpScope scope("tp_attention_block");
  const int tokens_axis = token_axis(o);
  const AttentionParams local = local_attention_params(p, mesh.axis_size(o.tp_axis));
  const std::int64_t total = total_rows(segments);
  const Range mine = split_range(total, mesh.axis_size(tokens_axis), mesh.axis_index(tokens_axis));
  check_and_agree(mesh.comm(), "tp_cached_attention_block", [&] {
    MESHTEST_CHECK(x.rank() == 2 && x.shape()[0] == mine.size,
                   "x has shape {}, expected [{}, hidden] (this device's share of the step's {} "
                   "rows)",
                   x.shape(), mine.size, total);
    check_attention(w, local, x.shape()[1], x.dtype());
    check_cache_segments("tp_cached_attention_block", segments, local.num_kv_heads, local.head_dim,
                         x.dtype(), total);
  });
  const Tensor t = rms_norm(x, w.norm_scale, p.norm_eps);
  // This device's rows, segment by segment: q, k and v at their positions. Every device runs
  // each segment's ops, on no rows where it holds none of the segment's, so that the devices'
  // op sequences (their perf records) stay alike.
  std::vector<Piece> pieces;
  std::vector<Tensor> ks, vs;
  std::int64_t row = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const CacheSegment& s = segments[i];
    const std::int64_t lo = std::max(row, mine.start);
    const std::int64_t n =
        std::max<std::int64_t>(0, std::min(row + s.rows, mine.start + mine.size) - lo);
    const Tensor rows_t = n == mine.size ? t : t.slice(0, n > 0 ? lo - mine.start : 0, n);
    const std::int64_t position = n > 0 ? s.first + (lo - row) : s.first;
    Qkv qkv = attention_qkv(rows_t, w, local, position);
    pieces.push_back({.segment = i, .first = position, .q = std::move(qkv.q)});
    ks.push_back(std::move(qkv.k));
    vs.push_back(std::move(qkv.v));
    row += s.rows;
  }
  Tensor k = join_rows(ks);
  Tensor v = join_rows(vs);
  if (mesh.axis_size(tokens_axis) > 1) {  // every device writes every row of the step
    k = all_gather(mesh, k, {.dim = 0, .axis = tokens_axis});
    v = all_gather(mesh, v, {.dim = 0, .axis = tokens_axis});
  }
  row = 0;
  for (const CacheSegment& s : segments) {
    std::vector<std::int64_t> positions(static_cast<std::size_t>(s.rows));
    std::iota(positions.begin(), positions.end(), s.first);
    s.cache->write(k.slice(0, row, s.rows), v.slice(0, row, s.rows), positions);
    row += s.rows;
  }
  std::vector<Tensor> parts;
  for (const Piece& piece : pieces) {
    const CacheSegment& s = segments[piece.segment];
    const std::int64_t end = s.first + s.rows;  // the segment's keys, as the prefill's
    parts.push_back(attention_sdpa(piece.q, s.cache->keys(0, end), s.cache->values(0, end), w.sinks,
                                   local, piece.first));
  }
  const Tensor attn = join_rows(parts);
  // The out bias once, on TP device 0, inside its GEMM (as tp_attention_block).
  Tensor partial = mesh.axis_index(o.tp_axis) == 0 ? linear(attn, w.out_weight, w.out_bias)
                                                   : linear(attn, w.out_weight);
  all_reduce_inplace(mesh, partial, {.axis = o.tp_axis});
  return add(x, partial);
}

Tensor tp_transformer_block_cached(const MeshDevice& mesh, const Tensor& x, const BlockWeights& w,
                                   const GptOssConfig& c, std::int64_t layer,
                                   std::span<const CacheSegment> segments, const TpOptions& o,
                                   const BlockOptions& block) {
  perf::OpScope scope("tp_transformer_block");
  token_axis(o);
  check_tp_config(c, mesh.axis_size(o.tp_axis));
  const Tensor h = tp_cached_attention_block(mesh, x, w.attn,
                                             block_attention_params(c, layer, block), segments, o);
  return tp_mlp_block(mesh, h, w.mlp, block_moe_params(c, block), o);
}

Tensor tp_transformer_step(const MeshDevice& mesh, std::span<const std::int64_t> tokens,
                           const TpTransformerWeights& w, const GptOssConfig& c,
                           ModelKvCache& cache, const TransformerOptions& options,
                           const TpOptions& o) {
  perf::OpScope scope("tp_transformer_step");
  MESHTEST_DIST_CHECK(!tokens.empty(),
                      "tp_transformer_step: no tokens given (T = 0), expected T >= 1");
  const auto rows = static_cast<std::int64_t>(tokens.size());
  return tp_step_over("tp_transformer_step", mesh, tokens, w, c, std::span(&cache, 1),
                      std::span(&rows, 1), options, o);
}

Tensor tp_transformer_decode(const MeshDevice& mesh, std::span<const std::int64_t> tokens,
                             const TpTransformerWeights& w, const GptOssConfig& c,
                             std::span<ModelKvCache> caches, const TransformerOptions& options,
                             const TpOptions& o) {
  perf::OpScope scope("tp_transformer_decode");
  MESHTEST_DIST_CHECK(!tokens.empty() && tokens.size() == caches.size(),
                      "tp_transformer_decode: {} tokens for {} caches, expected one token per "
                      "cache (>= 1)",
                      tokens.size(), caches.size());
  const std::vector<std::int64_t> rows(tokens.size(), 1);
  return tp_step_over("tp_transformer_decode", mesh, tokens, w, c, caches, rows, options, o);
}

}  // namespace meshtest::dist
