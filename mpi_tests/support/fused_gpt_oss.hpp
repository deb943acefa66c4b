// Shared pieces of the gpt-oss fused-op tests (test_fused_*.cpp): the module's config, dtype
// and layer, its attention weights (seeded random or from the checkpoint) and activations, and
// the TP shard of the qkv projection as a chunked.hpp ShardFn.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dist/parallel/tp_shard.hpp"
#include "dist/testing/fused/fused_op.hpp"
#include "src/core/random.hpp"
#include "src/models/checkpoint.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"

namespace meshtest::dist::fused_test {

using testing::FusedMode;
using testing::FusedSetup;

/// The module's activation and weight dtype (the published checkpoints' bf16).
inline constexpr DType kDtype = DType::bf16;
/// The module's layer: 0, an even layer, so attention has the sliding window.
inline constexpr std::int64_t kLayer = 0;
/// Decode: the one new token sits after this many cached tokens.
inline constexpr std::int64_t kDecodeContext = 128;

/// The module's config: the checkpoint's config.json with checkpoint weights, else
/// GptOssConfig::tiny_tp() (16 q / 8 kv heads of 8, hidden 64: TP over 1, 2, 4 or 8 devices).
/// config.json is read once per directory: the fused functions ask for the config on every
/// call, and e2e timing must not include a file read.
inline GptOssConfig config(const FusedSetup& s) {
  if (s.checkpoint == nullptr) return GptOssConfig::tiny_tp();
  static std::map<std::filesystem::path, GptOssConfig> read;
  auto it = read.find(s.checkpoint->dir());
  if (it == read.end())
    it = read.emplace(s.checkpoint->dir(), read_config(s.checkpoint->dir())).first;
  return it->second;
}

/// Checkpoint name of attention tensor `rel` ("qkv.weight") of kLayer.
/// `c` fixed on the seed's 4x8 mesh (TP over 8 on axis 1, the rows alike): on 32 ranks it runs
/// whole; on fewer, device 0's chunk of it runs on one device (FusedOpCase::chunk_fallback).
inline testing::FusedOpCase on_seed_mesh(testing::FusedOpCase c) {
  c.mesh = testing::MeshShape{4, 8};
  c.chunk_fallback = true;
  return c;
}

inline std::string attn_name(const std::string& rel) {
  return fmt::format("block.{}.attn.{}", kLayer, rel);
}

/// Layer kLayer's attention weights in kDtype: seeded random (init_attention_weights), with
/// the tensors `from_checkpoint` (relative names, "qkv.weight") read from the checkpoint when
/// the setup has one.
inline AttentionWeights attention_weights(const FusedSetup& s, const GptOssConfig& c,
                                          const std::vector<std::string>& from_checkpoint) {
  AttentionWeights w = init_attention_weights(c, kLayer, kDtype, RandomInit{s.seed});
  if (s.checkpoint == nullptr) return w;
  const WeightSource src = checkpoint_source(*s.checkpoint, kDtype);
  for (const std::string& rel : from_checkpoint) {
    Tensor t = src.whole(attn_name(rel));
    if (rel == "qkv.weight") w.qkv_weight = std::move(t);
    if (rel == "qkv.bias") w.qkv_bias = std::move(t);
    if (rel == "sinks") w.sinks = std::move(t);
  }
  return w;
}

/// Seeded activations of `shape` in kDtype (the same on every rank).
inline Tensor activation(const FusedSetup& s, Shape shape, std::uint64_t stream) {
  return random_normal(std::move(shape), kDtype, {.seed = s.seed, .stream = 1000 + stream});
}

/// Tokens of the run: 1 in decode, seqlen in prefill; and the position of the first.
inline std::int64_t tokens(const FusedSetup& s) { return s.params.seqlen; }
inline std::int64_t first_position(const FusedSetup& s) {
  return s.params.mode == FusedMode::decode ? kDecodeContext : 0;
}
/// Keys the run's queries attend over: the cached context and the new tokens.
inline std::int64_t keys(const FusedSetup& s) { return first_position(s) + tokens(s); }
/// Devices of the TP axis (axis 1 of the configuration).
inline std::int64_t tp_size(const FusedSetup& s) { return s.mesh[1]; }

/// The TP shard of attention tensor qkv.weight or qkv.bias (`which`) that device `coord` of a
/// mesh holds with TP over axis 1: the rows of its q, k and v heads, by
/// shard_attention_weights (tp_shard.hpp). `w` holds the full weights.
inline testing::ShardFn qkv_shard(std::shared_ptr<const AttentionWeights> w, GptOssConfig c,
                                  bool bias) {
  return [w = std::move(w), c, bias](const Tensor&, testing::MeshShape shape,
                                     testing::MeshCoord coord) {
    const BlockWeights block{.attn = *w, .mlp = {}};
    const AttentionWeights shard = shard_attention_weights(weight_source(block, kLayer), c, kLayer,
                                                           {.size = shape[1], .index = coord[1]});
    return bias ? shard.qkv_bias : shard.qkv_weight;
  };
}

/// Heads held by a qkv weight of `rows` rows under `c` (a device's TP share, or all):
/// {q heads, kv heads}, from rows = (heads + 2 kv_heads) head_dim and c's heads per kv head.
inline std::pair<std::int64_t, std::int64_t> qkv_heads(const GptOssConfig& c, std::int64_t rows) {
  const std::int64_t per_kv = c.num_attention_heads / c.num_key_value_heads;
  const std::int64_t kv = rows / (c.head_dim * (per_kv + 2));
  return {kv * per_kv, kv};
}

}  // namespace meshtest::dist::fused_test
