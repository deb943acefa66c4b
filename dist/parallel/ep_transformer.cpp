// ep_transformer: the gpt-oss model with TP attention and expert-parallel MLPs, its shards from
// memory or a checkpoint.
#include "dist/parallel/ep_transformer.hpp"

#include <algorithm>

#include "dist/mesh/mpi_check.hpp"
#include "src/models/checkpoint.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dist {
namespace {

std::int64_t layers_of(const GptOssConfig& c, std::int64_t num_layers, std::string_view op) {
  MESHTEST_DIST_CHECK(num_layers >= -1 && num_layers <= c.num_hidden_layers,
                      "{}: num_layers is {}, expected -1 (all) or 0 .. {}", op, num_layers,
                      c.num_hidden_layers);
  return num_layers < 0 ? c.num_hidden_layers : num_layers;
}

}  // namespace

EpTransformerWeights shard_ep_transformer_weights(const WeightSource& src, const GptOssConfig& c,
                                                  const ExpertPlacement& placement, int ep_device,
                                                  TpRank tp, std::int64_t num_layers) {
  const std::int64_t layers = layers_of(c, num_layers, "expert parallel");
  EpTransformerWeights w{.tp = shard_transformer_weights(src, c, tp, 0), .mlp = {}};
  for (std::int64_t n = 0; n < layers; ++n) {
    w.tp.blocks.push_back({.attn = shard_attention_weights(src, c, n, tp), .mlp = {}});
    w.mlp.push_back(shard_ep_mlp_weights(src, c, n, placement, ep_device, tp));
  }
  return w;
}

EpTransformerWeights read_ep_checkpoint(const std::filesystem::path& dir, const GptOssConfig& c,
                                        DType compute, const ExpertPlacement& placement,
                                        int ep_device, TpRank tp, std::int64_t num_layers) {
  check_tp_config(c, tp.size);
  const std::int64_t layers = layers_of(c, num_layers, "read_ep_checkpoint");
  const CheckpointDir ckpt = CheckpointDir::open(dir);
  check_checkpoint_shapes(ckpt, c, layers);
  return shard_ep_transformer_weights(checkpoint_source(ckpt, compute), c, placement, ep_device, tp,
                                      num_layers);
}

Tensor ep_transformer(const MeshDevice& mesh, std::span<const std::int64_t> tokens,
                      const EpTransformerWeights& w, const GptOssConfig& c,
                      const TransformerOptions& options, const EpOptions& o) {
  perf::OpScope scope("ep_transformer");
  const TpOptions tp{.tp_axis = ep_tp_axis(o)};
  const auto held = static_cast<std::int64_t>(std::min(w.tp.blocks.size(), w.mlp.size()));
  return tp_transformer_with(
      mesh, tokens, w.tp, held, c, options, tp,
      [&](const Tensor& x, std::int64_t n, std::int64_t offset) {
        const auto i = static_cast<std::size_t>(n);
        const BlockOptions block{.fused = options.fused};
        const Tensor h = tp_attention_block(mesh, x, w.tp.blocks[i].attn,
                                            block_attention_params(c, n, block), tp, offset);
        return ep_mlp_block(mesh, h, w.mlp[i], block_moe_params(c, block), o);
      });
}

}  // namespace meshtest::dist
