// ep_transformer: the gpt-oss model with expert-parallel MLP blocks: on an R x C mesh with EP
// on axis A the tokens are split over axis A, the attention heads and the vocab over the other
// axis (tensor parallel, as tp_transformer with tp_axis = 1 − A), and each MoE MLP runs
// ep_mlp_block (experts placed on axis A, their units split over 1 − A).
//
// Every function is collective over the whole mesh where it communicates; bad input throws the
// same meshtest::Error on every device before any communication.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/expert_parallel.hpp"
#include "dist/parallel/tensor_parallel.hpp"
#include "dist/parallel/tp_shard.hpp"
#include "src/core/tensor.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/transformer.hpp"
#include "src/ops/moe/balance.hpp"

namespace meshtest::dist {

/// One device's weights of the EP model.
struct EpTransformerWeights {
  /// The vocab-parallel tables and final norm (over the TP axis), and blocks[n].attn: the TP
  /// shard of block n's attention (blocks[n].mlp is left empty).
  TpTransformerWeights tp;
  std::vector<EpMlpWeights> mlp;  ///< block n's EP MLP shard (shard_ep_mlp_weights)
};

/// This device's shard of the first `num_layers` blocks (-1: all): attention and tables as
/// shard_transformer_weights (TP rank `tp`), the MLPs as shard_ep_mlp_weights (placement,
/// ep_device). Errors: theirs (heads or units that `tp.size` does not split, a bad placement).
EpTransformerWeights shard_ep_transformer_weights(const WeightSource& src, const GptOssConfig& c,
                                                  const ExpertPlacement& placement, int ep_device,
                                                  TpRank tp, std::int64_t num_layers = -1);

/// Reads only this device's shard from the checkpoint `dir` in `compute` dtype (checkpoint
/// shapes checked first, as read_tp_checkpoint): one expert at a time for the MLPs.
EpTransformerWeights read_ep_checkpoint(const std::filesystem::path& dir, const GptOssConfig& c,
                                        DType compute, const ExpertPlacement& placement,
                                        int ep_device, TpRank tp, std::int64_t num_layers = -1);

/// The model on this device's tokens (array_split over the EP axis) and vocab rows:
/// tp_transformer's embedding, attention, final norm and unembedding with tp_axis = 1 − ep_axis,
/// and ep_mlp_block (options `o`) for every MLP.
///   tokens: all T >= 1 ids (the same on every device)  ->  logits [T_local, vocab_local],
///   placed tp_logits_placements({.tp_axis = 1 − o.ep_axis})
/// Throws Error for a bad ep_axis, T = 0, an id outside [0, vocab), fewer blocks held than
/// layers to run, or the errors of the blocks, on every device.
Tensor ep_transformer(const MeshDevice& mesh, std::span<const std::int64_t> tokens,
                      const EpTransformerWeights& w, const GptOssConfig& c,
                      const TransformerOptions& options = {}, const EpOptions& o = {});

}  // namespace meshtest::dist
