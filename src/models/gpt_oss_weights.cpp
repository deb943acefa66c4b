// gpt-oss weights: init, dtype conversion and checkpoint-named validation.
#include "src/models/gpt_oss_weights.hpp"

#include <cmath>
#include <string>

#include "src/ops/compute.hpp"

namespace meshtest {
namespace {

enum class Kind { scale, weight, bias, normal };

// Makes tensor `id` of layer `layer` (-1: model-level); `fan_in` sets the weight std.
class Maker {
 public:
  Maker(DType dtype, const WeightInit& init, std::int64_t layer)
      : dtype_(dtype), init_(init), layer_(layer) {}

  Tensor operator()(Shape shape, Kind kind, std::uint64_t id, std::int64_t fan_in = 1) const {
    if (const auto* c = std::get_if<ConstantInit>(&init_)) {
      Tensor t(shape, dtype_);
      t.fill(c->value);
      return t;
    }
    const RandomKey key{.seed = std::get<RandomInit>(init_).seed,
                        .stream = static_cast<std::uint64_t>(layer_ + 1) * 64 + id};
    switch (kind) {
      case Kind::scale:
        return random_uniform(shape, dtype_, key, 0.5, 1.5);
      case Kind::weight:
        return random_normal(shape, dtype_, key, 0.0, 1.0 / std::sqrt(static_cast<double>(fan_in)));
      case Kind::bias:
        return random_normal(shape, dtype_, key, 0.0, 0.1);
      case Kind::normal:
        break;
    }
    return random_normal(shape, dtype_, key, 0.0, 1.0);
  }

 private:
  DType dtype_;
  const WeightInit& init_;
  std::int64_t layer_;
};

void check_layer(const GptOssConfig& c, std::int64_t layer) {
  MESHTEST_CHECK(layer >= 0 && layer < c.num_hidden_layers, "layer {} is outside [0, {})", layer,
                 c.num_hidden_layers);
}

// Runs f; an Error it throws is rethrown with `prefix` (the checkpoint name) in front.
template <class F>
void with_prefix(const std::string& prefix, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    throw Error(prefix + ": " + e.what());
  }
}

}  // namespace

AttentionWeights init_attention_weights(const GptOssConfig& c, std::int64_t layer, DType dtype,
                                        const WeightInit& init) {
  c.validate();
  check_layer(c, layer);
  const Maker make(dtype, init, layer);
  const std::int64_t h = c.hidden_size;
  const std::int64_t qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim;
  const std::int64_t attn = c.num_attention_heads * c.head_dim;
  return {.norm_scale = make(Shape{h}, Kind::scale, 0),
          .qkv_weight = make(Shape{qkv, h}, Kind::weight, 1, h),
          .qkv_bias = make(Shape{qkv}, Kind::bias, 2),
          .sinks = make(Shape{c.num_attention_heads}, Kind::normal, 3),
          .out_weight = make(Shape{h, attn}, Kind::weight, 4, attn),
          .out_bias = make(Shape{h}, Kind::bias, 5)};
}

MlpWeights init_mlp_weights(const GptOssConfig& c, std::int64_t layer, DType dtype,
                            const WeightInit& init) {
  c.validate();
  check_layer(c, layer);
  const Maker make(dtype, init, layer);
  const std::int64_t h = c.hidden_size;
  const std::int64_t e = c.num_experts;
  const std::int64_t i = c.intermediate_size;
  return {.norm_scale = make(Shape{h}, Kind::scale, 16),
          .gate_weight = make(Shape{e, h}, Kind::weight, 17, h),
          .gate_bias = make(Shape{e}, Kind::bias, 18),
          .mlp1_weight = make(Shape{e, 2 * i, h}, Kind::weight, 19, h),
          .mlp1_bias = make(Shape{e, 2 * i}, Kind::bias, 20),
          .mlp2_weight = make(Shape{e, h, i}, Kind::weight, 21, i),
          .mlp2_bias = make(Shape{e, h}, Kind::bias, 22)};
}

BlockWeights init_block_weights(const GptOssConfig& c, std::int64_t layer, DType dtype,
                                const WeightInit& init) {
  return {init_attention_weights(c, layer, dtype, init), init_mlp_weights(c, layer, dtype, init)};
}

TransformerWeights init_transformer_weights(const GptOssConfig& c, DType dtype,
                                            const WeightInit& init) {
  c.validate();
  const Maker make(dtype, init, -1);
  TransformerWeights w;
  w.embedding = make(Shape{c.vocab_size, c.hidden_size}, Kind::normal, 0);
  for (std::int64_t n = 0; n < c.num_hidden_layers; ++n) {
    w.blocks.push_back(init_block_weights(c, n, dtype, init));
  }
  w.norm_scale = make(Shape{c.hidden_size}, Kind::scale, 1);
  w.unembedding = make(Shape{c.vocab_size, c.hidden_size}, Kind::weight, 2, c.hidden_size);
  return w;
}

BlockWeights astype(const BlockWeights& w, DType dtype) {
  const AttentionWeights& a = w.attn;
  const MlpWeights& m = w.mlp;
  return {{.norm_scale = a.norm_scale.astype(dtype),
           .qkv_weight = a.qkv_weight.astype(dtype),
           .qkv_bias = a.qkv_bias.astype(dtype),
           .sinks = a.sinks.astype(dtype),
           .out_weight = a.out_weight.astype(dtype),
           .out_bias = a.out_bias.astype(dtype)},
          {.norm_scale = m.norm_scale.astype(dtype),
           .gate_weight = m.gate_weight.astype(dtype),
           .gate_bias = m.gate_bias.astype(dtype),
           .mlp1_weight = m.mlp1_weight.astype(dtype),
           .mlp1_bias = m.mlp1_bias.astype(dtype),
           .mlp2_weight = m.mlp2_weight.astype(dtype),
           .mlp2_bias = m.mlp2_bias.astype(dtype)}};
}

TransformerWeights astype(const TransformerWeights& w, DType dtype) {
  TransformerWeights out;
  out.embedding = w.embedding.astype(dtype);
  for (const BlockWeights& b : w.blocks) out.blocks.push_back(astype(b, dtype));
  out.norm_scale = w.norm_scale.astype(dtype);
  out.unembedding = w.unembedding.astype(dtype);
  return out;
}

void check_block_weights(const BlockWeights& w, const GptOssConfig& c, std::int64_t layer,
                         DType dtype) {
  const std::string prefix = fmt::format("block.{}", layer);
  with_prefix(prefix + ".attn",
              [&] { check_attention(w.attn, c.attention_params(layer), c.hidden_size, dtype); });
  with_prefix(prefix + ".mlp", [&] {
    check_mlp(w.mlp, c.moe_params(), c.hidden_size, dtype);
    detail::check_shape("mlp_block", "gate.weight", w.mlp.gate_weight,
                        Shape{c.num_experts, c.hidden_size});
    detail::check_shape("mlp_block", "mlp2_weight", w.mlp.mlp2_weight,
                        Shape{c.num_experts, c.hidden_size, c.intermediate_size});
  });
}

void check_transformer_weights(const TransformerWeights& w, const GptOssConfig& c) {
  c.validate();
  const DType dtype = w.dtype();
  const Shape vh{c.vocab_size, c.hidden_size};
  detail::check_shape("transformer", "embedding.weight", w.embedding, vh);
  detail::check_shape("transformer", "unembedding.weight", w.unembedding, vh);
  detail::check_dtype("transformer", "unembedding.weight", w.unembedding, dtype);
  detail::check_shape("transformer", "norm.scale", w.norm_scale, Shape{c.hidden_size});
  MESHTEST_CHECK(is_floating(w.norm_scale.dtype()),
                 "transformer: norm.scale has dtype {}, expected f32, f64, bf16 or f16",
                 w.norm_scale.dtype());
  MESHTEST_CHECK(static_cast<std::int64_t>(w.blocks.size()) == c.num_hidden_layers,
                 "transformer: {} blocks of weights, expected num_hidden_layers = {}",
                 w.blocks.size(), c.num_hidden_layers);
  for (std::int64_t n = 0; n < c.num_hidden_layers; ++n) {
    check_block_weights(w.blocks[n], c, n, dtype);
  }
}

}  // namespace meshtest
