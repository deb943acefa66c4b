// tp_shard: tensor-parallel slices of the gpt-oss weights, from memory or a checkpoint.
#include "dist/parallel/tp_shard.hpp"

#include <fmt/format.h>

#include <charconv>
#include <string_view>
#include <utility>

#include "dist/mesh/mpi_check.hpp"
#include "src/models/checkpoint.hpp"

namespace meshtest::dist {
namespace {

void check_divides(std::string_view what, std::int64_t count, int tp) {
  MESHTEST_DIST_CHECK(tp >= 1, "tensor parallel: {} devices on the TP axis, expected >= 1", tp);
  MESHTEST_DIST_CHECK(
      count % tp == 0,
      "tensor parallel: {} = {} cannot be split over {} devices (it is not a multiple "
      "of {}); use a TP axis whose size divides {}",
      what, count, tp, tp, what);
}

void check_rank(TpRank tp) {
  MESHTEST_DIST_CHECK(tp.size >= 1 && tp.index >= 0 && tp.index < tp.size,
                      "tensor parallel: device index {} of {} is out of range", tp.index, tp.size);
}

// The tensor of block weights `w` with block-relative checkpoint name `rel` ("attn.sinks").
const Tensor& block_tensor(const BlockWeights& w, std::string_view rel, std::string_view full) {
  const std::pair<std::string_view, const Tensor*> table[] = {
      {"attn.norm.scale", &w.attn.norm_scale}, {"attn.qkv.weight", &w.attn.qkv_weight},
      {"attn.qkv.bias", &w.attn.qkv_bias},     {"attn.sinks", &w.attn.sinks},
      {"attn.out.weight", &w.attn.out_weight}, {"attn.out.bias", &w.attn.out_bias},
      {"mlp.norm.scale", &w.mlp.norm_scale},   {"mlp.gate.weight", &w.mlp.gate_weight},
      {"mlp.gate.bias", &w.mlp.gate_bias},     {"mlp.mlp1_weight", &w.mlp.mlp1_weight},
      {"mlp.mlp1_bias", &w.mlp.mlp1_bias},     {"mlp.mlp2_weight", &w.mlp.mlp2_weight},
      {"mlp.mlp2_bias", &w.mlp.mlp2_bias}};
  for (const auto& [name, t] : table) {
    if (name == rel) return *t;
  }
  fail("tensor parallel: no weight '{}'", full);
}

// Splits "block.{n}.rest" into n and rest; n = -1 for a model-level name.
std::pair<std::int64_t, std::string_view> split_block_name(std::string_view name) {
  constexpr std::string_view prefix = "block.";
  if (!name.starts_with(prefix)) return {-1, name};
  const std::string_view rest = name.substr(prefix.size());
  std::int64_t n = -1;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), n);
  MESHTEST_DIST_CHECK(ec == std::errc{} && end < rest.data() + rest.size() && *end == '.',
                      "tensor parallel: weight name '{}' is not block.<n>.<name>", name);
  return {n, rest.substr(static_cast<std::size_t>(end - rest.data()) + 1)};
}

WeightSource source_of(std::function<const Tensor&(const std::string&)> find) {
  return {.whole = [find](const std::string& name) { return find(name); },
          .slice = [find](const std::string& name, int dim,
                          Range r) { return find(name).slice(dim, r); }};
}

}  // namespace

void check_tp_attention(const AttentionParams& p, int tp) {
  check_divides("num_attention_heads", p.num_heads, tp);
  check_divides("num_key_value_heads", p.num_kv_heads, tp);
}

void check_tp_mlp(std::int64_t intermediate_size, int tp) {
  check_divides("intermediate_size", intermediate_size, tp);
}

void check_tp_config(const GptOssConfig& c, int tp) {
  c.validate();
  check_tp_attention(c.attention_params(0), tp);
  check_tp_mlp(c.intermediate_size, tp);
}

AttentionParams local_attention_params(const AttentionParams& p, int tp) {
  check_tp_attention(p, tp);
  AttentionParams local = p;
  local.num_heads = p.num_heads / tp;
  local.num_kv_heads = p.num_kv_heads / tp;
  return local;
}

WeightSource weight_source(const BlockWeights& w, std::int64_t layer) {
  return source_of([&w, layer](const std::string& name) -> const Tensor& {
    const auto [n, rel] = split_block_name(name);
    MESHTEST_DIST_CHECK(n == layer, "tensor parallel: weight '{}' asked of the weights of block {}",
                        name, layer);
    return block_tensor(w, rel, name);
  });
}

WeightSource weight_source(const TransformerWeights& w, const GptOssConfig& c) {
  check_transformer_weights(w, c);
  return source_of([&w](const std::string& name) -> const Tensor& {
    const auto [n, rel] = split_block_name(name);
    if (n >= 0) {
      MESHTEST_DIST_CHECK(n < static_cast<std::int64_t>(w.blocks.size()),
                          "tensor parallel: weight '{}' of a model with {} blocks", name,
                          w.blocks.size());
      return block_tensor(w.blocks[static_cast<std::size_t>(n)], rel, name);
    }
    if (rel == "embedding.weight") return w.embedding;
    if (rel == "norm.scale") return w.norm_scale;
    if (rel == "unembedding.weight") return w.unembedding;
    fail("tensor parallel: no weight '{}'", name);
  });
}

WeightSource checkpoint_source(const CheckpointDir& ckpt, DType compute) {
  return {.whole =
              [&ckpt, compute](const std::string& name) {
                return read_tensor(ckpt, name, checkpoint_read_dtype(ckpt, name, compute));
              },
          .slice =
              [&ckpt, compute](const std::string& name, int dim, Range r) {
                return read_tensor_slice(ckpt, name, dim, r,
                                         checkpoint_read_dtype(ckpt, name, compute));
              }};
}

AttentionWeights shard_attention_weights(const WeightSource& src, const GptOssConfig& c,
                                         std::int64_t layer, TpRank tp) {
  check_rank(tp);
  const AttentionParams p = c.attention_params(layer);
  check_tp_attention(p, tp.size);
  const std::int64_t d = p.head_dim, hp = p.num_heads / tp.size, kvp = p.num_kv_heads / tp.size;
  const std::int64_t q0 = tp.index * hp * d, k0 = p.num_heads * d + tp.index * kvp * d;
  const std::int64_t v0 = k0 + p.num_kv_heads * d;
  const std::string pre = fmt::format("block.{}.attn.", layer);
  const auto qkv = [&](const std::string& name) {
    return concat({src.slice(pre + name, 0, {q0, hp * d}), src.slice(pre + name, 0, {k0, kvp * d}),
                   src.slice(pre + name, 0, {v0, kvp * d})},
                  0);
  };
  return {.norm_scale = src.whole(pre + "norm.scale"),
          .qkv_weight = qkv("qkv.weight"),
          .qkv_bias = qkv("qkv.bias"),
          .sinks = src.slice(pre + "sinks", 0, {tp.index * hp, hp}),
          .out_weight = src.slice(pre + "out.weight", 1, {q0, hp * d}),
          .out_bias = src.whole(pre + "out.bias")};
}

MlpWeights shard_mlp_weights(const WeightSource& src, const GptOssConfig& c, std::int64_t layer,
                             TpRank tp) {
  check_rank(tp);
  c.validate();
  check_tp_mlp(c.intermediate_size, tp.size);
  const std::int64_t ip = c.intermediate_size / tp.size;
  const std::string pre = fmt::format("block.{}.mlp.", layer);
  return {.norm_scale = src.whole(pre + "norm.scale"),
          .gate_weight = src.whole(pre + "gate.weight"),
          .gate_bias = src.whole(pre + "gate.bias"),
          .mlp1_weight = src.slice(pre + "mlp1_weight", 1, {2 * tp.index * ip, 2 * ip}),
          .mlp1_bias = src.slice(pre + "mlp1_bias", 1, {2 * tp.index * ip, 2 * ip}),
          .mlp2_weight = src.slice(pre + "mlp2_weight", 2, {tp.index * ip, ip}),
          .mlp2_bias = src.whole(pre + "mlp2_bias")};
}

BlockWeights shard_block_weights(const WeightSource& src, const GptOssConfig& c, std::int64_t layer,
                                 TpRank tp) {
  return {shard_attention_weights(src, c, layer, tp), shard_mlp_weights(src, c, layer, tp)};
}

TpTransformerWeights shard_transformer_weights(const WeightSource& src, const GptOssConfig& c,
                                               TpRank tp, std::int64_t num_layers) {
  check_rank(tp);
  check_tp_config(c, tp.size);
  MESHTEST_DIST_CHECK(num_layers >= -1 && num_layers <= c.num_hidden_layers,
                      "tensor parallel: num_layers is {}, expected -1 (all) or 0 .. {}", num_layers,
                      c.num_hidden_layers);
  TpTransformerWeights w;
  w.vocab = split_range(c.vocab_size, tp.size, tp.index);
  w.embedding = src.slice("embedding.weight", 0, w.vocab);
  const std::int64_t layers = num_layers < 0 ? c.num_hidden_layers : num_layers;
  for (std::int64_t n = 0; n < layers; ++n) w.blocks.push_back(shard_block_weights(src, c, n, tp));
  w.norm_scale = src.whole("norm.scale");
  w.unembedding = src.slice("unembedding.weight", 0, w.vocab);
  return w;
}

TpTransformerWeights read_tp_checkpoint(const std::filesystem::path& dir, const GptOssConfig& c,
                                        DType compute, TpRank tp, std::int64_t num_layers) {
  check_rank(tp);
  check_tp_config(c, tp.size);
  MESHTEST_DIST_CHECK(num_layers >= -1 && num_layers <= c.num_hidden_layers,
                      "read_tp_checkpoint: num_layers is {}, expected -1 (all) or 0 .. {}",
                      num_layers, c.num_hidden_layers);
  const CheckpointDir ckpt = CheckpointDir::open(dir);
  check_checkpoint_shapes(ckpt, c, num_layers < 0 ? c.num_hidden_layers : num_layers);
  return shard_transformer_weights(checkpoint_source(ckpt, compute), c, tp, num_layers);
}

}  // namespace meshtest::dist
