// tp_transformer (GPU): the TP attention block over cache segments, the TP MLP block, and the
// model's embedding, blocks and unembedding for a prefill, a step and a batch decode.
#include "dist/gpu/parallel/tp_transformer.hpp"

#include <algorithm>
#include <array>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "dist/gpu/ccl/ccl.hpp"
#include "dist/gpu/parallel/tp_experts.hpp"
#include "dist/mesh/agree.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/gpu/embedding.hpp"
#include "src/gpu/linear.hpp"
#include "src/gpu/qkv_rope.hpp"
#include "src/gpu/reduce.hpp"
#include "src/gpu/rms_norm.hpp"
#include "src/gpu/sdpa.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dist {
namespace {

namespace g = meshtest::gpu;

/// t on the GPU; nothing for a tensor without storage (a default Tensor: an EP model's blocks
/// hold no TP MLP).
DeviceTensor on_gpu(const Tensor& t) {
  return t.nbytes() == 0 ? DeviceTensor{} : DeviceTensor::from_host(t);
}
DeviceTensor f32_on_gpu(const Tensor& t) {
  return t.nbytes() == 0 ? DeviceTensor{} : DeviceTensor::from_host(t.astype(DType::f32));
}

/// x + y in x's dtype (the CPU add's bits), complete when it returns.
DeviceTensor residual(g::Blas& blas, const DeviceTensor& x, const DeviceTensor& y) {
  DeviceTensor out(x.shape(), x.dtype(), Tensor::Uninitialized{});
  const std::array<const std::byte*, 2> terms{x.bytes(), y.bytes()};
  if (!out.empty()) {
    g::reduce_terms(out.bytes(), terms, x.numel(), x.dtype(), g::Reduce::sum, blas.stream());
  }
  blas.synchronize();
  return out;
}

void check_activation(std::string_view op, const DeviceTensor& x, std::int64_t rows,
                      std::int64_t hidden) {
  MESHTEST_DIST_CHECK(x.rank() == 2 && x.shape()[0] == rows && x.shape()[1] == hidden &&
                          (x.dtype() == DType::f32 || x.dtype() == DType::bf16),
                      "{}: x is {}, expected f32 or bf16 [{}, {}] (this device's rows of the "
                      "step, hidden)",
                      op, g::describe(x), rows, hidden);
}

/// The rows of segment i in the step: [start, start + rows).
std::vector<std::int64_t> segment_starts(std::span<const GpuCacheSegment> segments) {
  std::vector<std::int64_t> starts;
  std::int64_t start = 0;
  for (const GpuCacheSegment& s : segments) {
    starts.push_back(start);
    start += s.rows;
  }
  starts.push_back(start);
  return starts;
}

/// A run of this device's rows inside one segment: local rows [row, row + rows) at positions
/// pos .. pos + rows − 1.
struct Run {
  std::size_t segment = 0;
  std::int64_t row = 0, rows = 0, pos = 0;
};

std::vector<Run> local_runs(std::span<const GpuCacheSegment> segments,
                            const std::vector<std::int64_t>& starts, Range mine) {
  std::vector<Run> runs;
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const std::int64_t lo = std::max(starts[s], mine.start);
    const std::int64_t hi = std::min(starts[s + 1], mine.start + mine.size);
    if (hi > lo) {
      runs.push_back({.segment = s,
                      .row = lo - mine.start,
                      .rows = hi - lo,
                      .pos = segments[s].first + lo - starts[s]});
    }
  }
  return runs;
}

/// The segments' checks: rows >= 1, distinct caches of kv_heads x head_dim in dtype, positions
/// that continue each cache and fit it; no cache at all, or one on every segment.
void check_segments(std::span<const GpuCacheSegment> segments, std::int64_t kv_heads,
                    std::int64_t head_dim, DType dtype) {
  MESHTEST_DIST_CHECK(!segments.empty(), "tp_attention_block: no segments (a step has >= 1)");
  const bool cached = segments[0].cache != nullptr;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const GpuCacheSegment& s = segments[i];
    MESHTEST_DIST_CHECK(s.rows >= 1 && s.first >= 0 && (s.cache != nullptr) == cached,
                        "tp_attention_block: segment {} has {} rows from position {}{}; expected "
                        ">= 1 rows from >= 0, a cache on every segment or on none",
                        i, s.rows, s.first, s.cache != nullptr ? " with a cache" : "");
    if (!cached) continue;
    const g::DeviceKvCache& c = *s.cache;
    MESHTEST_DIST_CHECK(c.kv_heads() == kv_heads && c.head_dim() == head_dim && c.dtype() == dtype,
                        "tp_attention_block: segment {}'s cache holds {} heads of {} in {}, "
                        "expected {} of {} in {} (this device's kv heads)",
                        i, c.kv_heads(), c.head_dim(), c.dtype(), kv_heads, head_dim, dtype);
    MESHTEST_DIST_CHECK(s.first <= c.length() && s.first + s.rows <= c.max_len(),
                        "tp_attention_block: segment {} writes positions [{}, {}) to a cache of "
                        "{} positions holding {}: a gap or past its end",
                        i, s.first, s.first + s.rows, c.max_len(), c.length());
    for (std::size_t j = 0; j < i; ++j) {
      MESHTEST_DIST_CHECK(segments[j].cache != s.cache,
                          "tp_attention_block: segments {} and {} share a cache", j, i);
    }
  }
}

}  // namespace

GpuBlockShard to_gpu(const BlockWeights& shard) {
  return {.attn_norm = f32_on_gpu(shard.attn.norm_scale),
          .projection = to_device(shard.attn),
          .sinks = on_gpu(shard.attn.sinks),
          .mlp_norm = f32_on_gpu(shard.mlp.norm_scale),
          .gate_weight = on_gpu(shard.mlp.gate_weight),
          .gate_bias = on_gpu(shard.mlp.gate_bias),
          .mlp1_weight = on_gpu(shard.mlp.mlp1_weight),
          .mlp1_bias = on_gpu(shard.mlp.mlp1_bias),
          .mlp2_weight = on_gpu(shard.mlp.mlp2_weight),
          .mlp2_bias = on_gpu(shard.mlp.mlp2_bias)};
}

GpuTpTransformerWeights to_gpu(const TpTransformerWeights& w) {
  GpuTpTransformerWeights out{.vocab = w.vocab,
                              .embedding = DeviceTensor::from_host(w.embedding),
                              .blocks = {},
                              .norm_scale = f32_on_gpu(w.norm_scale),
                              .unembedding = DeviceTensor::from_host(w.unembedding)};
  for (const BlockWeights& b : w.blocks) out.blocks.push_back(to_gpu(b));
  return out;
}

GpuEpTransformerWeights to_gpu(const EpTransformerWeights& w) {
  GpuEpTransformerWeights out{.tp = to_gpu(w.tp), .mlp = {}};
  for (const EpMlpWeights& m : w.mlp) out.mlp.push_back(to_gpu(m));
  return out;
}

GpuModelKvCache::GpuModelKvCache(const MeshDevice& mesh, const GptOssConfig& c,
                                 std::int64_t max_len, DType dtype, const TpOptions& o,
                                 std::int64_t num_layers) {
  const AttentionParams local =
      local_attention_params(c.attention_params(0), mesh.axis_size(o.tp_axis));
  MESHTEST_CHECK(num_layers >= -1 && num_layers <= c.num_hidden_layers,
                 "GpuModelKvCache: num_layers is {}, expected -1 (all) or 0 .. {}", num_layers,
                 c.num_hidden_layers);
  const std::int64_t n = num_layers < 0 ? c.num_hidden_layers : num_layers;
  for (std::int64_t i = 0; i < n; ++i) {
    layers.emplace_back(max_len, local.num_kv_heads, local.head_dim, dtype);
  }
}

DeviceTensor tp_attention_block(const MeshDevice& mesh, g::Blas& blas, const DeviceTensor& x,
                                const GpuBlockShard& w, const AttentionParams& p,
                                std::span<const GpuCacheSegment> segments, const TpOptions& o) {
  constexpr std::string_view op = "tp_attention_block";
  perf::OpScope scope(op);
  const int tokens_axis = token_axis(o);
  const AttentionParams local = local_attention_params(p, mesh.axis_size(o.tp_axis));
  const std::vector<std::int64_t> starts = segment_starts(segments);
  const Range mine =
      split_range(starts.back(), mesh.axis_size(tokens_axis), mesh.axis_index(tokens_axis));
  check_and_agree(mesh.comm(), op, [&] {
    check_activation(op, x, mine.size, w.attn_norm.numel());
    check_segments(segments, local.num_kv_heads, local.head_dim, x.dtype());
  });
  const cudaStream_t stream = blas.stream();
  const std::int64_t kv = local.num_kv_heads;
  const DeviceTensor t = g::rms_norm(x, w.attn_norm, stream, p.norm_eps);
  blas.synchronize();  // t complete for the copies below
  // q, k and v of this device's rows: qkv_rope of one run of consecutive positions, qkv_rope_at
  // of several (every row at its own position in one Linear and one rotation).
  const std::vector<Run> runs = local_runs(segments, starts, mine);
  const bool one_run = runs.size() == 1;
  QkvRopeOptions qo{.num_heads = local.num_heads, .num_kv_heads = kv, .rope = local.rope};
  g::DeviceQkv qkv;
  if (one_run) {
    qo.position_offset = runs[0].pos;
    qkv = g::qkv_rope(blas, t, w.projection.qkv_weight, w.projection.qkv_bias, qo);
  } else {
    std::vector<std::int64_t> positions(static_cast<std::size_t>(mine.size));
    for (const Run& r : runs) {
      for (std::int64_t i = 0; i < r.rows; ++i)
        positions[static_cast<std::size_t>(r.row + i)] = r.pos + i;
    }
    qkv = g::qkv_rope_at(blas, t, w.projection.qkv_weight, w.projection.qkv_bias, qo, positions);
  }
  // Every row's keys and values, written to the segments' caches on the stream (one launch for
  // all of them, one wait at most).
  DeviceTensor k_gathered, v_gathered;
  const bool gathered = mesh.axis_size(tokens_axis) > 1;
  if (gathered) {
    k_gathered = all_gather(mesh, qkv.k, {.dim = 0, .axis = tokens_axis});
    v_gathered = all_gather(mesh, qkv.v, {.dim = 0, .axis = tokens_axis});
  }
  const DeviceTensor& k_all = gathered ? k_gathered : qkv.k;
  const DeviceTensor& v_all = gathered ? v_gathered : qkv.v;
  std::vector<g::KvCacheRows> writes;
  for (std::size_t s = 0; s < segments.size(); ++s) {
    if (segments[s].cache == nullptr) continue;
    writes.push_back({.cache = segments[s].cache,
                      .row = starts[s],
                      .n = segments[s].rows,
                      .first = segments[s].first});
  }
  const bool written = !writes.empty();
  if (written) g::DeviceKvCache::write_batch(k_all, v_all, writes, stream);
  // Each run's queries over its segment's keys up to its last position: a run of enough rows
  // alone on tensor cores (sdpa_sinks), else every run in one batch reading the caches in place
  // in the stream's order.
  DeviceTensor attn;
  const bool batched = !one_run || runs[0].rows < g::kSdpaTensorCoreRows;
  if (written && !batched) blas.synchronize();  // the writes done before the caches' copies
  if (batched) {
    std::vector<g::SdpaSequence> seqs;
    for (const Run& r : runs) {
      const GpuCacheSegment& s = segments[r.segment];
      if (s.cache != nullptr) {
        const std::int64_t first_key = s.cache->window_begin(r.pos, local.sliding_window);
        seqs.push_back({.rows = r.rows,
                        .q_offset = r.pos,
                        .keys = &s.cache->key_buffer(),
                        .values = &s.cache->value_buffer(),
                        .key_begin = first_key,
                        .key_end = r.pos + r.rows,
                        .k_offset = first_key});
      } else {
        seqs.push_back({.rows = r.rows,
                        .q_offset = r.pos,
                        .keys = &k_all,
                        .values = &v_all,
                        .key_begin = starts[r.segment],
                        .key_end = starts[r.segment] + s.rows,
                        .k_offset = s.first});
      }
    }
    attn =
        g::sdpa_sinks_batch(qkv.q, seqs, w.sinks, stream, {.sliding_window = local.sliding_window});
  } else {
    const Run& r = runs[0];
    const GpuCacheSegment& s = segments[r.segment];
    DeviceTensor keys, values;
    std::int64_t first_key = s.first;
    if (s.cache != nullptr) {
      first_key = s.cache->window_begin(r.pos, local.sliding_window);
      keys = s.cache->keys(first_key, r.pos + r.rows);
      values = s.cache->values(first_key, r.pos + r.rows);
    } else {
      keys = segments.size() == 1 ? k_all : k_all.slice(0, starts[r.segment], s.rows);
      values = segments.size() == 1 ? v_all : v_all.slice(0, starts[r.segment], s.rows);
    }
    attn = g::sdpa_sinks(
        qkv.q, keys, values, w.sinks, stream,
        {.sliding_window = local.sliding_window, .q_offset = r.pos, .k_offset = first_key});
  }
  const DeviceTensor out = tp_out_projection(mesh, blas, attn, w.projection, {.axis = o.tp_axis});
  return residual(blas, x, out);
}

DeviceTensor tp_mlp_block(const MeshDevice& mesh, g::Blas& blas, const DeviceTensor& x,
                          const GpuBlockShard& w, const MoeParams& p, const TpOptions& o) {
  constexpr std::string_view op = "tp_mlp_block";
  perf::OpScope scope(op);
  token_axis(o);
  check_and_agree(mesh.comm(), op, [&] {
    MESHTEST_DIST_CHECK(x.rank() == 2 && x.shape()[1] == w.mlp_norm.numel(),
                        "{}: x is {}, expected [T_local, {}]", op, g::describe(x),
                        w.mlp_norm.numel());
  });
  const DeviceTensor t = g::rms_norm(x, w.mlp_norm, blas.stream(), p.norm_eps);
  const GpuExpertShardRefs refs{w.gate_weight, w.gate_bias,   w.mlp1_weight,
                                w.mlp1_bias,   w.mlp2_weight, w.mlp2_bias};
  const DeviceTensor y = tp_experts(mesh, blas, t, refs, p, {.axis = o.tp_axis});
  return residual(blas, x, y);
}

DeviceTensor tp_transformer_block(const MeshDevice& mesh, g::Blas& blas, const DeviceTensor& x,
                                  const GpuBlockShard& w, const GptOssConfig& c, std::int64_t layer,
                                  std::span<const GpuCacheSegment> segments, const TpOptions& o) {
  perf::OpScope scope("tp_transformer_block");
  check_tp_config(c, mesh.axis_size(o.tp_axis));
  const DeviceTensor h =
      tp_attention_block(mesh, blas, x, w, c.attention_params(layer), segments, o);
  return tp_mlp_block(mesh, blas, h, w, c.moe_params(), o);
}

namespace {

/// A block's MLP: layer n's, on the attention block's output h.
using MlpBlockFn = std::function<DeviceTensor(const DeviceTensor& h, std::int64_t n)>;

/// The model over `caches` (none: a prefill without caches), rows[i] of the step's tokens going
/// to caches[i]: the checks (agreed), the embedding, the blocks (attention, then `mlp`, whose
/// weights hold `mlps` blocks), the final norm and the unembedding; the caches' lengths advanced
/// after the last block.
DeviceTensor run_model(const MeshDevice& mesh, g::Blas& blas, std::span<const std::int64_t> tokens,
                       const GpuTpTransformerWeights& w, std::size_t mlps, const MlpBlockFn& mlp,
                       const GptOssConfig& c, const TransformerOptions& options, const TpOptions& o,
                       std::span<GpuModelKvCache> caches, std::span<const std::int64_t> rows,
                       std::string_view op) {
  const int tokens_axis = token_axis(o);
  const auto total = static_cast<std::int64_t>(tokens.size());
  MESHTEST_DIST_CHECK(total >= 1, "{}: no tokens given (T = 0), expected T >= 1", op);
  for (std::int64_t i = 0; i < total; ++i) {
    MESHTEST_DIST_CHECK(tokens[i] >= 0 && tokens[i] < c.vocab_size,
                        "{}: token {} at position {} is outside the vocabulary [0, {})", op,
                        tokens[i], i, c.vocab_size);
  }
  check_tp_config(c, mesh.axis_size(o.tp_axis));
  const std::int64_t layers = options.num_layers < 0 ? c.num_hidden_layers : options.num_layers;
  MESHTEST_DIST_CHECK(options.num_layers >= -1 && layers <= c.num_hidden_layers,
                      "{}: num_layers is {}, expected -1 (all) or 0 .. {}", op, options.num_layers,
                      c.num_hidden_layers);
  check_and_agree(mesh.comm(), op, [&] {
    MESHTEST_DIST_CHECK(static_cast<std::int64_t>(std::min(w.blocks.size(), mlps)) >= layers &&
                            w.embedding.rank() == 2 && w.embedding.shape()[0] == w.vocab.size &&
                            w.unembedding.rank() == 2 && w.unembedding.shape()[0] == w.vocab.size,
                        "{}: the weights hold {} blocks and embedding {} / unembedding {} for "
                        "vocab rows [{}, {}); expected >= {} blocks and [{}, hidden] tables",
                        op, std::min(w.blocks.size(), mlps), g::describe(w.embedding),
                        g::describe(w.unembedding), w.vocab.start, w.vocab.start + w.vocab.size,
                        layers, w.vocab.size);
    for (std::size_t i = 0; i < caches.size(); ++i) {
      const GpuModelKvCache& cache = caches[i];
      MESHTEST_DIST_CHECK(static_cast<std::int64_t>(cache.layers.size()) == layers,
                          "{}: cache {} holds {} layers, the step runs {}", op, i,
                          cache.layers.size(), layers);
      MESHTEST_DIST_CHECK(layers == 0 || cache.layers[0].dtype() == w.embedding.dtype(),
                          "{}: cache {} holds {}, the weights are {}", op, i,
                          cache.layers[0].dtype(), w.embedding.dtype());
      MESHTEST_DIST_CHECK(layers == 0 || cache.length + rows[i] <= cache.layers[0].max_len(),
                          "{}: cache {} holds {} of {} positions; {} more do not fit", op, i,
                          cache.length, layers == 0 ? 0 : cache.layers[0].max_len(), rows[i]);
      for (std::size_t j = 0; j < i; ++j) {
        MESHTEST_DIST_CHECK(&caches[j] != &cache, "{}: caches {} and {} are one cache", op, j, i);
      }
    }
  });
  const cudaStream_t stream = blas.stream();
  const Range mine = split_range(total, mesh.axis_size(tokens_axis), mesh.axis_index(tokens_axis));
  DeviceTensor x = g::embedding_shard(
      tokens.subspan(static_cast<std::size_t>(mine.start), static_cast<std::size_t>(mine.size)),
      w.embedding, w.vocab.start, c.vocab_size, stream);
  blas.synchronize();  // the collective takes a complete tensor
  all_reduce_inplace(mesh, x, {.axis = o.tp_axis});
  for (std::int64_t n = 0; n < layers; ++n) {
    std::vector<GpuCacheSegment> segments;
    if (caches.empty()) {
      segments.push_back({.cache = nullptr, .first = 0, .rows = total});
    } else {
      for (std::size_t i = 0; i < caches.size(); ++i) {
        segments.push_back({.cache = &caches[i].layers[static_cast<std::size_t>(n)],
                            .first = caches[i].length,
                            .rows = rows[i]});
      }
    }
    const perf::OpScope block("transformer_block");
    const DeviceTensor h = tp_attention_block(mesh, blas, x, w.blocks[static_cast<std::size_t>(n)],
                                              c.attention_params(n), segments, o);
    x = mlp(h, n);
  }
  for (std::size_t i = 0; i < caches.size(); ++i) caches[i].length += rows[i];
  DeviceTensor logits =
      g::linear(blas, g::rms_norm(x, w.norm_scale, stream, c.norm_eps), w.unembedding);
  blas.synchronize();
  return logits;
}

/// The TP model's MLPs: tp_mlp_block of layer n's shard.
MlpBlockFn tp_mlps(const MeshDevice& mesh, g::Blas& blas, const GpuTpTransformerWeights& w,
                   const GptOssConfig& c, const TpOptions& o) {
  return [&mesh, &blas, &w, p = c.moe_params(), o](const DeviceTensor& h, std::int64_t n) {
    return tp_mlp_block(mesh, blas, h, w.blocks[static_cast<std::size_t>(n)], p, o);
  };
}

/// The expert-parallel model's MLPs: ep_mlp_block of layer n's shard.
MlpBlockFn ep_mlps(const MeshDevice& mesh, g::Blas& blas, const GpuEpTransformerWeights& w,
                   const GptOssConfig& c, const EpOptions& o) {
  return [&mesh, &blas, &w, p = c.moe_params(), o](const DeviceTensor& h, std::int64_t n) {
    return ep_mlp_block(mesh, blas, h, w.mlp[static_cast<std::size_t>(n)], p, o);
  };
}

}  // namespace

DeviceTensor tp_transformer(const MeshDevice& mesh, g::Blas& blas,
                            std::span<const std::int64_t> tokens, const GpuTpTransformerWeights& w,
                            const GptOssConfig& c, const TransformerOptions& options,
                            const TpOptions& o) {
  perf::OpScope scope("tp_transformer");
  return run_model(mesh, blas, tokens, w, w.blocks.size(), tp_mlps(mesh, blas, w, c, o), c, options,
                   o, {}, {}, "tp_transformer");
}

DeviceTensor tp_transformer_step(const MeshDevice& mesh, g::Blas& blas,
                                 std::span<const std::int64_t> tokens,
                                 const GpuTpTransformerWeights& w, const GptOssConfig& c,
                                 GpuModelKvCache& cache, const TransformerOptions& options,
                                 const TpOptions& o) {
  perf::OpScope scope("tp_transformer_step");
  const std::array<std::int64_t, 1> rows{static_cast<std::int64_t>(tokens.size())};
  return run_model(mesh, blas, tokens, w, w.blocks.size(), tp_mlps(mesh, blas, w, c, o), c, options,
                   o, {&cache, 1}, rows, "tp_transformer_step");
}

DeviceTensor tp_transformer_decode(const MeshDevice& mesh, g::Blas& blas,
                                   std::span<const std::int64_t> tokens,
                                   const GpuTpTransformerWeights& w, const GptOssConfig& c,
                                   std::span<GpuModelKvCache> caches,
                                   const TransformerOptions& options, const TpOptions& o) {
  perf::OpScope scope("tp_transformer_decode");
  MESHTEST_DIST_CHECK(tokens.size() == caches.size() && !caches.empty(),
                      "tp_transformer_decode: {} tokens for {} caches, expected one token per "
                      "cache (B >= 1)",
                      tokens.size(), caches.size());
  const std::vector<std::int64_t> rows(caches.size(), 1);
  return run_model(mesh, blas, tokens, w, w.blocks.size(), tp_mlps(mesh, blas, w, c, o), c, options,
                   o, caches, rows, "tp_transformer_decode");
}

DeviceTensor ep_transformer(const MeshDevice& mesh, g::Blas& blas,
                            std::span<const std::int64_t> tokens, const GpuEpTransformerWeights& w,
                            const GptOssConfig& c, const TransformerOptions& options,
                            const EpOptions& o) {
  perf::OpScope scope("ep_transformer");
  return run_model(mesh, blas, tokens, w.tp, w.mlp.size(), ep_mlps(mesh, blas, w, c, o), c, options,
                   {.tp_axis = ep_tp_axis(o)}, {}, {}, "ep_transformer");
}

DeviceTensor ep_transformer_step(const MeshDevice& mesh, g::Blas& blas,
                                 std::span<const std::int64_t> tokens,
                                 const GpuEpTransformerWeights& w, const GptOssConfig& c,
                                 GpuModelKvCache& cache, const TransformerOptions& options,
                                 const EpOptions& o) {
  perf::OpScope scope("ep_transformer_step");
  const std::array<std::int64_t, 1> rows{static_cast<std::int64_t>(tokens.size())};
  return run_model(mesh, blas, tokens, w.tp, w.mlp.size(), ep_mlps(mesh, blas, w, c, o), c, options,
                   {.tp_axis = ep_tp_axis(o)}, {&cache, 1}, rows, "ep_transformer_step");
}

}  // namespace meshtest::dist
