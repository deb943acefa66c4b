// tensor_parallel: the gpt-oss attention block, MLP block, transformer block and model with
// tensor parallelism on one mesh axis and the tokens split over the other.
//
// Layout on an R x C mesh with TP on axis 1 (TpOptions::tp_axis = 1, the default):
//   - the C devices of a row split heads, expert intermediate units and the vocab
//     (shards from dist/parallel/tp_shard.hpp);
//   - the R devices of a column split the tokens (any contiguous split, e.g. array_split:
//     placement Shard(0) on axis 0); positions are global, so RoPE, causality and the sliding
//     window hold across token shards; attention all_gathers keys and values along axis 0.
// Activations [T, hidden] are placed {Shard(0), Replicate} (tp_activation_placements) and logits
// [T, vocab] {Shard(0), Shard(1)} (tp_logits_placements). A 1 x N mesh is plain TP over N
// devices; an N x 1 mesh splits only the tokens. With tp_axis = 0 the roles of the axes swap.
//
// Every function is collective over the whole mesh: all devices call it with the same
// arguments apart from their own shards, and run the same CCLs in the same order. Bad input
// (head or intermediate counts that do not divide the TP axis, shapes that do not fit) throws
// the same meshtest::Error on every device before any communication. The options and placements
// of this layout (TpOptions, tp_rank, ...) are in tp_layout.hpp (included here).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/tp_layout.hpp"
#include "dist/parallel/tp_shard.hpp"
#include "dist/shard/placement.hpp"
#include "src/core/tensor.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/transformer.hpp"
#include "src/models/transformer_block.hpp"

namespace meshtest::dist {

/// Attention block on this device's heads and tokens (p: the full model's params; p.fused:
/// qkv_rope and sdpa_sinks in place of linear + split_qkv + rope and sdpa):
///   t = rms_norm(x); q, k, v = local heads of linear(t, qkv); RoPE at global positions;
///   k, v all_gathered over the token axis; o = sdpa(q, k, v, local sinks, window);
///   out = x + all_reduce_tp(linear(o, out.weight shard) [+ out.bias on TP device 0]).
/// The out bias joins device 0's partial inside its GEMM (one rounding, as the single-device
/// Linear with bias), so on a TP axis of one device the block equals attention_block bit for bit.
///   x: [T_local, hidden]  ->  [T_local, hidden];  w: shard_attention_weights(...)
/// token_offset: the global position of this device's first token. Left out, the block learns
/// it from the token counts of the devices before it on the token axis (one more all_gather);
/// a caller that knows its split (tp_transformer) passes it. Throws Error when negative.
Tensor tp_attention_block(const MeshDevice& mesh, const Tensor& x, const AttentionWeights& w,
                          const AttentionParams& p, const TpOptions& o = {},
                          std::optional<std::int64_t> token_offset = std::nullopt);

/// MLP block on this device's intermediate units and tokens: the router (gate, top-k, softmax)
/// runs replicated; y = all_reduce_tp(moe_experts(t, mlp1 / mlp2 shards)); then the mlp2 bias
/// is added once, in moe_combine; out = x + combine.
///   x: [T_local, hidden]  ->  [T_local, hidden];  w: shard_mlp_weights(...)
Tensor tp_mlp_block(const MeshDevice& mesh, const Tensor& x, const MlpWeights& w,
                    const MoeParams& p, const TpOptions& o = {});

/// Layer `layer`: tp_mlp_block(tp_attention_block(x, token_offset)), with the fused ops when
/// block.fused (block_attention_params / block_moe_params).
///   x: [T_local, hidden] -> same
Tensor tp_transformer_block(const MeshDevice& mesh, const Tensor& x, const BlockWeights& w,
                            const GptOssConfig& c, std::int64_t layer, const TpOptions& o = {},
                            std::optional<std::int64_t> token_offset = std::nullopt,
                            const BlockOptions& block = {});

/// The model on this device's tokens and vocab rows: vocab-parallel embedding (rows outside the
/// shard are zero, all_reduce over the TP axis), the blocks, the final norm and the unembedding
/// of the vocab shard. The position of the first local token comes from the array_split of the
/// tokens, so the blocks run no all_gather for it.
///   tokens: all T >= 1 ids (the same on every device)  ->  logits [T_local, vocab_local] with
///   T_local the array_split share of the token axis and vocab_local = w.vocab.size
/// Throws Error for T = 0 or an id outside [0, vocab) (position named), on every device.
Tensor tp_transformer(const MeshDevice& mesh, std::span<const std::int64_t> tokens,
                      const TpTransformerWeights& w, const GptOssConfig& c,
                      const TransformerOptions& options = {}, const TpOptions& o = {});

/// Layer `layer` of a model on this device's tokens x [T_local, hidden] whose first token is at
/// global position `token_offset`  ->  [T_local, hidden].
using TpBlockFn =
    std::function<Tensor(const Tensor& x, std::int64_t layer, std::int64_t token_offset)>;

/// tp_transformer with `block` for the blocks (w.blocks is not read): the embedding, the token
/// split, the final norm and the unembedding as tp_transformer, for models whose blocks hold
/// other shards (expert_parallel's ep_transformer). `blocks_held`: how many blocks the caller
/// holds (an Error, on every device, when the layers to run are more).
Tensor tp_transformer_with(const MeshDevice& mesh, std::span<const std::int64_t> tokens,
                           const TpTransformerWeights& w, std::int64_t blocks_held,
                           const GptOssConfig& c, const TransformerOptions& options,
                           const TpOptions& o, const TpBlockFn& block);

}  // namespace meshtest::dist
