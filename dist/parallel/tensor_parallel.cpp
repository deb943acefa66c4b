// tensor_parallel: TP attention (head split, row-parallel out), TP MoE (intermediate split),
// token split with gathered keys/values, vocab-parallel embedding and unembedding.
#include "dist/parallel/tensor_parallel.hpp"

#include <string>

#include "dist/ccl/all_gather.hpp"
#include "dist/ccl/all_reduce.hpp"
#include "dist/mesh/agree.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "dist/parallel/experts_tp.hpp"
#include "src/models/transformer_block.hpp"
#include "src/ops/attention.hpp"
#include "src/ops/elementwise.hpp"
#include "src/ops/embedding.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/moe/moe.hpp"
#include "src/ops/rms_norm.hpp"
#include "src/ops/rope.hpp"
#include "src/ops/sdpa.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dist {
namespace {

// Position of this device's first token: the token counts of the devices before it on the
// token axis, summed (one small all_gather; none on a 1-device axis).
std::int64_t gather_token_offset(const MeshDevice& mesh, std::int64_t local_tokens, int axis) {
  if (mesh.axis_size(axis) == 1) return 0;
  const Tensor mine = Tensor::from_vector<std::int64_t>(Shape{1}, {local_tokens});
  const Tensor all = all_gather(mesh, mine, {.dim = 0, .axis = axis});
  std::int64_t offset = 0;
  for (int i = 0; i < mesh.axis_index(axis); ++i) offset += all.span<std::int64_t>()[i];
  return offset;
}

// This device's input checks, agreed over the whole mesh (dist/mesh/agree.hpp): a bad input on
// any device throws the same error on all of them before any CCL, never a hang.
template <class F>
void check_on_all(const MeshDevice& mesh, std::string_view op, F&& checks) {
  check_and_agree(mesh.comm(), op, checks);
}

void check_activation(std::string_view op, const Tensor& x, std::int64_t hidden) {
  MESHTEST_DIST_CHECK(x.rank() == 2 && (hidden < 0 || x.shape()[1] == hidden),
                      "{}: x has shape {}, expected [T_local, hidden{}]", op, x.shape(),
                      hidden < 0 ? std::string() : fmt::format(" = {}", hidden));
}

void check_token_offset(std::string_view op, std::optional<std::int64_t> token_offset) {
  MESHTEST_DIST_CHECK(!token_offset || *token_offset >= 0,
                      "{}: token_offset is {}, expected the position of this device's first "
                      "token (>= 0) or none",
                      op, token_offset.value_or(0));
}

}  // namespace

Tensor tp_attention_block(const MeshDevice& mesh, const Tensor& x, const AttentionWeights& w,
                          const AttentionParams& p, const TpOptions& o,
                          std::optional<std::int64_t> token_offset) {
  perf::OpScope scope("tp_attention_block");
  const int tokens_axis = token_axis(o);
  const AttentionParams local = local_attention_params(p, mesh.axis_size(o.tp_axis));
  check_on_all(mesh, "tp_attention_block", [&] {
    check_activation("tp_attention_block", x, -1);
    check_attention(w, local, x.shape()[1], x.dtype());
    check_token_offset("tp_attention_block", token_offset);
  });
  const Tensor t = rms_norm(x, w.norm_scale, p.norm_eps);
  const std::int64_t offset =
      token_offset ? *token_offset : gather_token_offset(mesh, x.shape()[0], tokens_axis);
  auto [q, k, v] = attention_qkv(t, w, local, offset);
  if (mesh.axis_size(tokens_axis) > 1) {
    k = all_gather(mesh, k, {.dim = 0, .axis = tokens_axis});
    v = all_gather(mesh, v, {.dim = 0, .axis = tokens_axis});
  }
  const Tensor attn = attention_sdpa(q, k, v, w.sinks, local, offset);
  // Device 0 of the TP axis adds the out bias in its GEMM, rounding once as the single-device
  // Linear with bias does (on one device the block is the single-device one, bit for bit).
  Tensor partial = mesh.axis_index(o.tp_axis) == 0 ? linear(attn, w.out_weight, w.out_bias)
                                                   : linear(attn, w.out_weight);
  all_reduce_inplace(mesh, partial, {.axis = o.tp_axis});
  return add(x, partial);
}

Tensor tp_mlp_block(const MeshDevice& mesh, const Tensor& x, const MlpWeights& w,
                    const MoeParams& p, const TpOptions& o) {
  perf::OpScope scope("tp_mlp_block");
  token_axis(o);
  check_on_all(mesh, "tp_mlp_block", [&] {
    check_activation("tp_mlp_block", x, -1);
    check_mlp(w, p, x.shape()[1], x.dtype());
  });
  const Tensor t = rms_norm(x, w.norm_scale, p.norm_eps);
  if (p.fused) return add(x, tp_experts(mesh, t, w, p, o));  // fused experts, one all_reduce
  const Routing r = route_top_k(linear(t, w.gate_weight, w.gate_bias), p.experts_per_token);
  Tensor y = moe_experts(t, r, w.mlp1_weight, w.mlp1_bias, w.mlp2_weight, p);
  all_reduce_inplace(mesh, y, {.axis = o.tp_axis});
  return add(x, moe_combine(y, r, w.mlp2_bias));
}

Tensor tp_transformer_block(const MeshDevice& mesh, const Tensor& x, const BlockWeights& w,
                            const GptOssConfig& c, std::int64_t layer, const TpOptions& o,
                            std::optional<std::int64_t> token_offset, const BlockOptions& block) {
  perf::OpScope scope("tp_transformer_block");
  token_axis(o);
  check_tp_config(c, mesh.axis_size(o.tp_axis));
  check_on_all(mesh, "tp_transformer_block", [&] {
    check_activation("tp_transformer_block", x, c.hidden_size);
    check_token_offset("tp_transformer_block", token_offset);
  });
  const Tensor h =
      tp_attention_block(mesh, x, w.attn, block_attention_params(c, layer, block), o, token_offset);
  return tp_mlp_block(mesh, h, w.mlp, block_moe_params(c, block), o);
}

Tensor tp_transformer(const MeshDevice& mesh, std::span<const std::int64_t> tokens,
                      const TpTransformerWeights& w, const GptOssConfig& c,
                      const TransformerOptions& options, const TpOptions& o) {
  perf::OpScope scope("tp_transformer");
  return tp_transformer_with(mesh, tokens, w, static_cast<std::int64_t>(w.blocks.size()), c,
                             options, o, [&](const Tensor& x, std::int64_t n, std::int64_t offset) {
                               return tp_transformer_block(mesh, x,
                                                           w.blocks[static_cast<std::size_t>(n)], c,
                                                           n, o, offset, {.fused = options.fused});
                             });
}

Tensor tp_transformer_with(const MeshDevice& mesh, std::span<const std::int64_t> tokens,
                           const TpTransformerWeights& w, std::int64_t blocks_held,
                           const GptOssConfig& c, const TransformerOptions& options,
                           const TpOptions& o, const TpBlockFn& block) {
  const int tokens_axis = token_axis(o);
  MESHTEST_DIST_CHECK(!tokens.empty(), "transformer: no tokens given (T = 0), expected T >= 1");
  const auto total = static_cast<std::int64_t>(tokens.size());
  for (std::int64_t i = 0; i < total; ++i) {
    MESHTEST_DIST_CHECK(tokens[i] >= 0 && tokens[i] < c.vocab_size,
                        "transformer: token {} at position {} is outside the vocabulary [0, {})",
                        tokens[i], i, c.vocab_size);
  }
  check_tp_config(c, mesh.axis_size(o.tp_axis));
  const std::int64_t layers = options.num_layers < 0 ? c.num_hidden_layers : options.num_layers;
  MESHTEST_DIST_CHECK(options.num_layers >= -1 && layers <= c.num_hidden_layers,
                      "transformer: num_layers is {}, expected -1 (all) or 0 .. {}",
                      options.num_layers, c.num_hidden_layers);
  check_on_all(mesh, "tp_transformer", [&] {
    MESHTEST_DIST_CHECK(
        blocks_held >= layers && w.vocab.size >= 0 && w.embedding.rank() == 2 &&
            w.embedding.shape()[0] == w.vocab.size && w.unembedding.rank() == 2 &&
            w.unembedding.shape()[0] == w.vocab.size,
        "tp_transformer: the weights hold {} blocks and embedding {} / unembedding {} "
        "for vocab rows [{}, {}); expected >= {} blocks and [{}, hidden] tables "
        "(shard_transformer_weights or read_tp_checkpoint make them)",
        blocks_held, describe(w.embedding), describe(w.unembedding), w.vocab.start,
        w.vocab.start + w.vocab.size, layers, w.vocab.size);
  });
  const Range mine = split_range(total, mesh.axis_size(tokens_axis), mesh.axis_index(tokens_axis));
  const std::span<const std::int64_t> local =
      tokens.subspan(static_cast<std::size_t>(mine.start), static_cast<std::size_t>(mine.size));
  Tensor x = embedding_shard(local, w.embedding, w.vocab.start, c.vocab_size);
  all_reduce_inplace(mesh, x, {.axis = o.tp_axis});
  for (std::int64_t n = 0; n < layers; ++n) x = block(x, n, mine.start);
  return linear(rms_norm(x, w.norm_scale, c.norm_eps), w.unembedding);
}

}  // namespace meshtest::dist
