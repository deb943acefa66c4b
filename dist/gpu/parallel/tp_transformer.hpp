// tp_transformer (GPU): the tensor-parallel gpt-oss model on GPU ranks — the attention block,
// the MLP block, the transformer block and the model, with prefill and decode steps over KV
// caches on each rank's GPU. The layout is the CPU ranks' (dist/parallel/tensor_parallel.hpp,
// tp_decode.hpp): on an R x C mesh with TP on axis o.tp_axis, the devices of the TP axis split
// heads, the experts' intermediate units and the vocab (shard_transformer_weights' shards,
// copied to the GPU); the devices of the other axis split a step's rows (array_split), with
// positions global and the keys and values all_gathered along it. The ops are the GPU's:
// gpu::rms_norm, gpu::qkv_rope, gpu::sdpa_sinks over gpu::DeviceKvCache, the row-parallel out
// projection (tp_attention.hpp), the fused experts in their TP form (tp_experts.hpp: the router
// replicated, one exact all_reduce), the residual adds by gpu::reduce_terms (the CPU add's bits),
// the vocab-parallel gpu::embedding_shard and the unembedding by gpu::linear.
//
// Numerics: the attention and the experts are the fused ops' (qkv_rope, sdpa_sinks, experts:
// the CPU model with TransformerOptions::fused), with cuBLASLt's summation orders: the logits
// are the CPU single-device model's within the error model of its chain (model_chain), as long as
// the routing agrees (a token whose k-th and (k+1)-th router logits lie within their error of
// each other may take another expert on the GPU: the tests' rule). The collectives are exact.
//
// Every function is collective over the whole mesh: all devices call it with the same arguments
// apart from their own shards and caches. Bad input (a TP size that does not divide the heads or
// the units, shapes that do not fit, bad token ids, a cache that is full or of another depth)
// throws the same meshtest::Error on every device before any communication.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dist/gpu/parallel/ep_moe.hpp"
#include "dist/gpu/parallel/tp_attention.hpp"
#include "dist/parallel/ep_transformer.hpp"
#include "dist/parallel/tp_layout.hpp"
#include "dist/parallel/tp_shard.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/kv_cache.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/transformer.hpp"

namespace meshtest::dist {

/// One block's TP shard on this rank's GPU (shard_block_weights' tensors, copied).
struct GpuBlockShard {
  DeviceTensor attn_norm;               ///< attn.norm.scale [hidden] (f32 on the GPU)
  TpAttentionProjections projection;    ///< qkv and out of this device's heads
  DeviceTensor sinks;                   ///< attn.sinks of this device's heads [H/p]
  DeviceTensor mlp_norm;                ///< mlp.norm.scale [hidden] (f32 on the GPU)
  DeviceTensor gate_weight, gate_bias;  ///< the router, whole
  DeviceTensor mlp1_weight, mlp1_bias;  ///< this device's units of every expert
  DeviceTensor mlp2_weight, mlp2_bias;  ///< mlp2's columns of those units; its bias whole
};

/// This device's model weights on its GPU (TpTransformerWeights' tensors, copied).
struct GpuTpTransformerWeights {
  Range vocab;                        ///< the vocab rows of the tables held here
  DeviceTensor embedding;             ///< [vocab.size, hidden]
  std::vector<GpuBlockShard> blocks;  ///< blocks 0 .. n-1
  DeviceTensor norm_scale;            ///< [hidden] (f32 on the GPU)
  DeviceTensor unembedding;           ///< [vocab.size, hidden]
};

/// A block's host shard (shard_block_weights) or the model's (shard_transformer_weights,
/// read_tp_checkpoint) copied to the current GPU; the norm scales as f32 (exact for bf16: the
/// GPU's rms_norm computes in f32). Local.
GpuBlockShard to_gpu(const BlockWeights& shard);
GpuTpTransformerWeights to_gpu(const TpTransformerWeights& w);

/// One KV cache per layer on this rank's GPU for its share of the kv heads (c's over the TP
/// axis's size), and the number of tokens seen: the next position.
struct GpuModelKvCache {
  /// Room for max_len positions in each of num_layers layers (-1: all of c's), in `dtype`.
  /// Local. Throws Error when the TP size does not divide c's heads, or as DeviceKvCache does.
  GpuModelKvCache(const MeshDevice& mesh, const GptOssConfig& c, std::int64_t max_len, DType dtype,
                  const TpOptions& o = {}, std::int64_t num_layers = -1);
  std::vector<meshtest::gpu::DeviceKvCache> layers;
  std::int64_t length = 0;
};

/// The rows of a step that one sequence appends to its layer's cache: `rows` consecutive tokens
/// at positions first .. first + rows − 1. A step without caches (a plain prefill) has one
/// segment with cache null.
struct GpuCacheSegment {
  meshtest::gpu::DeviceKvCache* cache = nullptr;
  std::int64_t first = 0;
  std::int64_t rows = 0;
};

/// The attention block over the step's segments (every device passes the same positions, its
/// own caches; x holds this device's array_split share of the step's rows over the token axis):
///   t = rms_norm(x); q, k, v = qkv_rope(t) of this device's heads at the rows' positions;
///   k, v all_gathered over the token axis and written to every segment's cache; each local
///   query attends (sdpa_sinks, p's window) over its segment's keys up to its position;
///   out = x + all_reduce_tp(o · out_weightᵀ (+ out_bias on TP device 0)).
///   x: [T_local, hidden] (f32 or bf16)  ->  same;  p: the full model's params of the layer
DeviceTensor tp_attention_block(const MeshDevice& mesh, meshtest::gpu::Blas& blas,
                                const DeviceTensor& x, const GpuBlockShard& w,
                                const AttentionParams& p, std::span<const GpuCacheSegment> segments,
                                const TpOptions& o = {});

/// The MLP block: t = rms_norm(x); out = x + tp_experts(t) (the router replicated, this device's
/// units of every expert, the exact all_reduce over the TP axis).
///   x: [T_local, hidden]  ->  same
DeviceTensor tp_mlp_block(const MeshDevice& mesh, meshtest::gpu::Blas& blas, const DeviceTensor& x,
                          const GpuBlockShard& w, const MoeParams& p, const TpOptions& o = {});

/// Layer `layer`: tp_mlp_block(tp_attention_block(x, segments)), the sliding window on even
/// layers (c.attention_params(layer)).
DeviceTensor tp_transformer_block(const MeshDevice& mesh, meshtest::gpu::Blas& blas,
                                  const DeviceTensor& x, const GpuBlockShard& w,
                                  const GptOssConfig& c, std::int64_t layer,
                                  std::span<const GpuCacheSegment> segments,
                                  const TpOptions& o = {});

/// The model on the whole sequence (a prefill without caches): the vocab-parallel embedding
/// (rows outside the shard zero, all_reduce over the TP axis), the blocks, the final norm and
/// the unembedding of the vocab shard.
///   tokens: all T >= 1 ids (the same on every device)  ->  logits [T_local, vocab_local]
///   (tp_logits_placements(o)), the weights' dtype
/// options.fused is not read (the GPU's ops are the fused ones). Throws Error for T = 0, an id
/// outside [0, vocab) (position named), or fewer blocks than layers to run, on every device.
DeviceTensor tp_transformer(const MeshDevice& mesh, meshtest::gpu::Blas& blas,
                            std::span<const std::int64_t> tokens, const GpuTpTransformerWeights& w,
                            const GptOssConfig& c, const TransformerOptions& options = {},
                            const TpOptions& o = {});

/// One step over KV caches (transformer_step on GPU ranks): `tokens` at positions cache.length
/// .., each attending to every cached token and those before it; their keys and values are
/// written to the cache. On an empty cache it is tp_transformer. cache: of this device's kv heads
/// and the step's layer count (options.num_layers -1 or that count).
///   tokens: all T >= 1 ids  ->  logits [T_local, vocab_local]
/// Throws Error before touching the cache for what tp_transformer rejects, a cache of another
/// dtype or depth, or positions past its max_len.
DeviceTensor tp_transformer_step(const MeshDevice& mesh, meshtest::gpu::Blas& blas,
                                 std::span<const std::int64_t> tokens,
                                 const GpuTpTransformerWeights& w, const GptOssConfig& c,
                                 GpuModelKvCache& cache, const TransformerOptions& options = {},
                                 const TpOptions& o = {});

/// Batch decode (transformer_decode on GPU ranks): tokens[i] appended to caches[i] at its own
/// position; the norms, projections and MLP run on the batch, attention per sequence over its
/// cache. The B rows split over the token axis like a step's.
///   tokens: B >= 1 ids, caches: B  ->  logits [B_local, vocab_local]
DeviceTensor tp_transformer_decode(const MeshDevice& mesh, meshtest::gpu::Blas& blas,
                                   std::span<const std::int64_t> tokens,
                                   const GpuTpTransformerWeights& w, const GptOssConfig& c,
                                   std::span<GpuModelKvCache> caches,
                                   const TransformerOptions& options = {}, const TpOptions& o = {});

/// One device's weights of the expert-parallel model on its GPU: the TP model's tables, final
/// norm and attention shards (tp.blocks[n]'s MLP fields empty) and every block's EP MLP shard.
struct GpuEpTransformerWeights {
  GpuTpTransformerWeights tp;
  std::vector<GpuEpMlpWeights> mlp;
};

/// EpTransformerWeights (shard_ep_transformer_weights, read_ep_checkpoint) on the current GPU.
GpuEpTransformerWeights to_gpu(const EpTransformerWeights& w);

/// The expert-parallel model (ep_transformer on GPU ranks): the TP model's embedding, attention,
/// final norm and unembedding with TP on 1 − o.ep_axis and the tokens split over o.ep_axis,
/// and ep_mlp_block (dist/gpu/parallel/ep_moe.hpp: experts placed on o.ep_axis, their units
/// split over the other axis, the routes planned on the host) for every MLP.
///   tokens: all T >= 1 ids  ->  logits [T_local, vocab_local], placed
///   tp_logits_placements({.tp_axis = 1 − o.ep_axis})
/// Throws Error as tp_transformer does, for a bad ep_axis, or as the EP blocks do.
DeviceTensor ep_transformer(const MeshDevice& mesh, meshtest::gpu::Blas& blas,
                            std::span<const std::int64_t> tokens, const GpuEpTransformerWeights& w,
                            const GptOssConfig& c, const TransformerOptions& options = {},
                            const EpOptions& o = {});

/// One step of the expert-parallel model over KV caches (GpuModelKvCache for TP over
/// 1 − o.ep_axis), as tp_transformer_step.
DeviceTensor ep_transformer_step(const MeshDevice& mesh, meshtest::gpu::Blas& blas,
                                 std::span<const std::int64_t> tokens,
                                 const GpuEpTransformerWeights& w, const GptOssConfig& c,
                                 GpuModelKvCache& cache, const TransformerOptions& options = {},
                                 const EpOptions& o = {});

}  // namespace meshtest::dist
