// tp_decode: the tensor-parallel gpt-oss model (tensor_parallel.hpp's layout) over KV caches —
// a prefill fills each device's caches, decode steps of one token read them, and a batch step
// appends one token to each of several sequences at their own positions (src/models/decode.hpp
// on one device).
//
// Each device caches the keys and values of its TP shard's kv heads at every position of the
// sequence: the token axis splits a step's rows (array_split, some devices may get none) and
// all_gathers their keys and values, as the prefill does, so the devices of a TP column hold
// the same cache. Every function is collective over the mesh; bad input (a cache that does not
// fit, a step past its end) throws the same Error on every device before any cache is written.
#pragma once

#include <cstdint>
#include <span>

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/tensor_parallel.hpp"
#include "src/models/decode.hpp"

namespace meshtest::dist {

/// A cache of max_len positions for this device's kv heads (c's over the TP axis's size) in
/// each of num_layers layers (-1: all of c's). Local. Throws Error when the TP size does not
/// divide c's heads, or as ModelKvCache does.
ModelKvCache tp_kv_cache(const MeshDevice& mesh, const GptOssConfig& c, std::int64_t max_len,
                         DType dtype, const TpOptions& o = {}, std::int64_t num_layers = -1);

/// tp_attention_block over KV caches: `segments` describe the whole step (every device passes
/// the same positions, its own caches); x holds this device's array_split share of the step's
/// rows. The keys and values of the step are all_gathered over the token axis and every
/// segment's written to its cache; each local query attends over its segment's cache up to the
/// segment's last position. One segment on empty caches is tp_attention_block bit for bit.
///   x: [T_local, hidden]  ->  same
Tensor tp_cached_attention_block(const MeshDevice& mesh, const Tensor& x, const AttentionWeights& w,
                                 const AttentionParams& p, std::span<const CacheSegment> segments,
                                 const TpOptions& o = {});

/// Layer `layer`: tp_mlp_block(tp_cached_attention_block(x, segments)), fused when block.fused.
Tensor tp_transformer_block_cached(const MeshDevice& mesh, const Tensor& x, const BlockWeights& w,
                                   const GptOssConfig& c, std::int64_t layer,
                                   std::span<const CacheSegment> segments, const TpOptions& o = {},
                                   const BlockOptions& block = {});

/// transformer_step on the mesh: `tokens` (all T of the step, the same on every device) at
/// positions cache.length .., the logits of this device's tokens and vocab rows
/// [T_local, vocab_local] (tp_logits_placements). On empty caches it is tp_transformer bit for
/// bit. cache: tp_kv_cache's.
Tensor tp_transformer_step(const MeshDevice& mesh, std::span<const std::int64_t> tokens,
                           const TpTransformerWeights& w, const GptOssConfig& c,
                           ModelKvCache& cache, const TransformerOptions& options = {},
                           const TpOptions& o = {});

/// transformer_decode on the mesh: tokens[i] appended to caches[i]; the B rows split over the
/// token axis like a step's  ->  [B_local, vocab_local].
Tensor tp_transformer_decode(const MeshDevice& mesh, std::span<const std::int64_t> tokens,
                             const TpTransformerWeights& w, const GptOssConfig& c,
                             std::span<ModelKvCache> caches, const TransformerOptions& options = {},
                             const TpOptions& o = {});

}  // namespace meshtest::dist
