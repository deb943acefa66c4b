// tp_shard: the slice of every gpt-oss weight a tensor-parallel device holds, taken from full
// weights or read from a checkpoint (only the slice is read). Local: no communication.
//
// With p devices on the TP axis and device index i (sizes as in the reference, H q heads,
// KV kv heads, d head_dim, I intermediate, V vocab):
//   attn.qkv.weight  rows of q heads [i H/p, (i+1) H/p), then of k and v heads [i KV/p, ...)
//                    -> [(H/p + 2 KV/p) d, hidden]; qkv.bias likewise
//   attn.sinks       [H/p] (the same q heads)
//   attn.out.weight  columns of those q heads -> [hidden, H/p d] (row-parallel; out.bias whole,
//                    added once after the all_reduce)
//   mlp.mlp1_weight  rows [2 i I/p, 2 (i+1) I/p) -> [E, 2I/p, hidden]: whole glu/linear pairs
//                    of units [i I/p, (i+1) I/p) (rows are interleaved); mlp1_bias likewise
//   mlp.mlp2_weight  columns of those units -> [E, hidden, I/p] (mlp2_bias whole, added once)
//   norm scales, mlp.gate.*  whole (replicated)
//   embedding.weight, unembedding.weight  rows split by the array_split rule (vocab parallel)
// H, KV and I must be multiples of p: otherwise a clear Error names the count and p.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "src/core/tensor.hpp"
#include "src/models/checkpoint.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"

namespace meshtest::dist {

/// A device's place on the tensor-parallel axis: `index` of `size` devices.
struct TpRank {
  int size = 1;
  int index = 0;
};

/// Throws Error unless the heads of `p` can be split over `tp` devices (num_heads and
/// num_kv_heads multiples of tp), naming the count and tp.
void check_tp_attention(const AttentionParams& p, int tp);
/// Throws Error unless intermediate_size is a multiple of tp, naming both.
void check_tp_mlp(std::int64_t intermediate_size, int tp);
/// Both checks for every layer of `c`.
void check_tp_config(const GptOssConfig& c, int tp);

/// The params of one device's heads: num_heads / tp and num_kv_heads / tp, the rest as `p`.
AttentionParams local_attention_params(const AttentionParams& p, int tp);

/// Where shards come from: `whole(name)` returns a whole tensor and `slice(name, dim, r)` only
/// [r.start, r.start + r.size) along `dim`. Names are checkpoint names ("block.0.attn.sinks").
struct WeightSource {
  std::function<Tensor(const std::string& name)> whole;
  std::function<Tensor(const std::string& name, int dim, Range r)> slice;
};

/// A source over in-memory full weights (its tensors are sliced, not copied whole first).
WeightSource weight_source(const TransformerWeights& w, const GptOssConfig& c);
/// A source over one block's full weights, as layer `layer`.
WeightSource weight_source(const BlockWeights& w, std::int64_t layer);

/// A source over the checkpoint `ckpt` (which must outlive it) in `compute` dtype (norm scales
/// stored in f32 stay f32 with bf16, as read_checkpoint): a slice reads only that slice.
WeightSource checkpoint_source(const CheckpointDir& ckpt, DType compute);

/// This device's attention / MLP / block shard of layer `layer`.
AttentionWeights shard_attention_weights(const WeightSource& src, const GptOssConfig& c,
                                         std::int64_t layer, TpRank tp);
MlpWeights shard_mlp_weights(const WeightSource& src, const GptOssConfig& c, std::int64_t layer,
                             TpRank tp);
BlockWeights shard_block_weights(const WeightSource& src, const GptOssConfig& c, std::int64_t layer,
                                 TpRank tp);

/// One device's weights of the whole model.
struct TpTransformerWeights {
  Range vocab;                       ///< the vocab rows of embedding and unembedding held here
  Tensor embedding;                  ///< embedding.weight rows `vocab`    [vocab.size, hidden]
  std::vector<BlockWeights> blocks;  ///< shards of blocks 0 .. n-1
  Tensor norm_scale;                 ///< norm.scale (whole)               [hidden]
  Tensor unembedding;                ///< unembedding.weight rows `vocab`  [vocab.size, hidden]
};

/// This device's shard of the first `num_layers` blocks (-1: all) and the model-level weights.
TpTransformerWeights shard_transformer_weights(const WeightSource& src, const GptOssConfig& c,
                                               TpRank tp, std::int64_t num_layers = -1);

/// Reads only this device's shard from the checkpoint `dir` in `compute` dtype (norm scales
/// stored in f32 stay f32 with bf16, as read_checkpoint). Checks every tensor's shape against
/// `c` first, so a missing or misshapen tensor gives the same Error on every device.
TpTransformerWeights read_tp_checkpoint(const std::filesystem::path& dir, const GptOssConfig& c,
                                        DType compute, TpRank tp, std::int64_t num_layers = -1);

}  // namespace meshtest::dist
