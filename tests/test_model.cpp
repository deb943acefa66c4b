// The gpt-oss configs, transformer_block and the tiny transformer.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "src/check/gpt_oss_chains.hpp"
#include "src/check/metrics.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/models/transformer.hpp"
#include "src/models/transformer_block.hpp"
#include "src/ops/attention.hpp"
#include "src/ops/embedding.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/moe/moe.hpp"
#include "src/ops/rms_norm.hpp"

namespace meshtest {
namespace test_model {

const std::vector<std::int64_t> kTokens{3, 17, 127, 0, 64, 17, 5, 99, 42, 8, 1};

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(GptOssConfig, TinyTpSplitsOver1248) {
  const GptOssConfig c = GptOssConfig::tiny_tp();
  EXPECT_NO_THROW(c.validate());
  for (const std::int64_t p : {1, 2, 4, 8}) {
    EXPECT_EQ(c.num_attention_heads % p, 0);
    EXPECT_EQ(c.num_key_value_heads % p, 0);
    EXPECT_EQ(c.intermediate_size % p, 0);
  }
  EXPECT_NE(c.num_key_value_heads % 3, 0);  // the TP tests expect the clear error at 3
}

TEST(GptOssConfig, PublishedConfigs) {
  // openai/gpt-oss gpt_oss/torch/model.py ModelConfig (defaults = 120b) and the 20b
  // config.json: 24 layers, 32 experts.
  const GptOssConfig a = GptOssConfig::gpt_oss_20b();
  EXPECT_EQ(a.num_hidden_layers, 24);
  EXPECT_EQ(a.num_experts, 32);
  const GptOssConfig b = GptOssConfig::gpt_oss_120b();
  EXPECT_EQ(b.num_hidden_layers, 36);
  EXPECT_EQ(b.num_experts, 128);
  for (const GptOssConfig& c : {a, b}) {
    EXPECT_EQ(c.vocab_size, 201088);
    EXPECT_EQ(c.hidden_size, 2880);
    EXPECT_EQ(c.num_attention_heads, 64);
    EXPECT_EQ(c.num_key_value_heads, 8);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.experts_per_token, 4);
    EXPECT_EQ(c.intermediate_size, 2880);
    EXPECT_EQ(c.sliding_window, 128);
    EXPECT_EQ(c.initial_context_length, 4096);
    EXPECT_EQ(c.rope_theta, 150000.0);
    EXPECT_EQ(c.rope_scaling_factor, 32.0);
    EXPECT_EQ(c.rope_ntk_alpha, 1.0);
    EXPECT_EQ(c.rope_ntk_beta, 32.0);
    EXPECT_EQ(c.swiglu_limit, 7.0);
    EXPECT_NO_THROW(c.validate());
    EXPECT_EQ(c.layer_sliding_window(0), 128);
    EXPECT_EQ(c.layer_sliding_window(1), 0);
  }
  EXPECT_NO_THROW(GptOssConfig::tiny().validate());
}

TEST(GptOssConfig, BadFieldsAreNamed) {
  GptOssConfig c = GptOssConfig::tiny();
  c.num_key_value_heads = 3;
  EXPECT_NE(error_of([&] { c.validate(); }).find("num_key_value_heads"), std::string::npos);
  c = GptOssConfig::tiny();
  c.experts_per_token = 5;
  EXPECT_NE(error_of([&] { c.validate(); }).find("experts_per_token"), std::string::npos);
  c = GptOssConfig::tiny();
  c.head_dim = 4;  // YaRN band does not fit
  EXPECT_NE(error_of([&] { c.validate(); }).find("low < high"), std::string::npos);
  c = GptOssConfig::tiny();
  c.vocab_size = 0;
  EXPECT_NE(error_of([&] { c.validate(); }).find("vocab_size"), std::string::npos);
  EXPECT_THROW(GptOssConfig::tiny().layer_sliding_window(2), Error);
}

TEST(Transformer, ConstantInitGivesFiniteLogitsOfTheRightShape) {
  const GptOssConfig c = GptOssConfig::tiny();
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    const TransformerWeights w = init_transformer_weights(c, dt, ConstantInit{0.5});
    const Tensor logits = transformer(kTokens, w, c);
    ASSERT_EQ(logits.shape(), (Shape{static_cast<std::int64_t>(kTokens.size()), c.vocab_size}));
    ASSERT_EQ(logits.dtype(), dt);
    for (std::int64_t i = 0; i < logits.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(logits.item(i))) << dtype_name(dt) << " " << i;
    }
    // Equal unembedding rows: every logit of a position is the same dot product over hidden,
    // which the GEMM may add in another order for another column (-march=native's edge columns
    // do). A constant model's activations are constant along hidden, so the terms have one sign:
    // their magnitude is the logit's.
    const ErrorModel m{.dtype = dt, .terms = c.hidden_size};
    for (std::int64_t t = 0; t < logits.shape()[0]; ++t) {
      const Tensor row = logits.slice(0, t, 1);
      Tensor first(row.shape(), dt);
      first.fill(row.item(0));
      const Comparison r = compare(first, row, m);
      EXPECT_TRUE(r.passed) << dtype_name(dt) << " position " << t << ": " << r;
    }
  }
}

TEST(Transformer, RandomInitF64AndF32Agree) {
  const GptOssConfig c = GptOssConfig::tiny();
  const TransformerWeights w32 = init_transformer_weights(c, DType::f32, RandomInit{21});
  const Tensor l32 = transformer(kTokens, w32, c);
  const Tensor l64 = transformer(kTokens, astype(w32, DType::f64), c);
  // f32 against an f64 reference on the same weights, the logits' scale max |l64|.
  ErrorModel m{.dtype = DType::f32,
               .terms = model_chain(c, static_cast<std::int64_t>(kTokens.size())).terms,
               .reference = Reference::exact};
  const Comparison same = compare(l64, l32, m);
  EXPECT_TRUE(same.passed) << same;
  EXPECT_GE(pcc(l64, l32), 0.99999);
  // Weights drawn directly in f64 (not rounded through f32): each weight's own f32 rounding
  // perturbs its product once more, as many errors again as the sums' roundings.
  const Tensor d64 =
      transformer(kTokens, init_transformer_weights(c, DType::f64, RandomInit{21}), c);
  m.terms *= 2;
  const Comparison drawn = compare(d64, l32, m);
  EXPECT_TRUE(drawn.passed) << drawn;
}

TEST(Transformer, Bf16WithinPccOfF64) {
  const GptOssConfig c = GptOssConfig::tiny();
  const TransformerWeights w = init_transformer_weights(c, DType::bf16, RandomInit{22});
  const Tensor l16 = transformer(kTokens, w, c);
  const Tensor l64 = transformer(kTokens, astype(w, DType::f64), c);
  // On the same bf16 weights, each of the ~30 bf16 roundings of the ops' outputs adds about
  // u^2/3 (u = 2^-8) to the nmse: ~1.5e-4, pcc ~ 1 - nmse / 2 ~ 0.9999; 0.99 is a loose floor a
  // wrong op (not a rounding) falls through.
  EXPECT_GE(pcc(l64, l16), 0.99);
}

TEST(Transformer, IsTheCompositionOfItsBlocks) {
  const GptOssConfig c = GptOssConfig::tiny();
  const TransformerWeights w = init_transformer_weights(c, DType::f64, RandomInit{23});
  Tensor x = embedding(kTokens, w.embedding);
  for (std::int64_t n = 0; n < c.num_hidden_layers; ++n) {
    const Tensor after_attn = attention_block(x, w.blocks[n].attn, c.attention_params(n));
    const Tensor block = transformer_block(x, w.blocks[n], c, n);
    EXPECT_TRUE(block.bitwise_equal(mlp_block(after_attn, w.blocks[n].mlp, c.moe_params())));
    x = block;
    TransformerOptions o;
    o.num_layers = n + 1;
    const Tensor logits = transformer(kTokens, w, c, o);
    EXPECT_TRUE(logits.bitwise_equal(linear(rms_norm(x, w.norm_scale), w.unembedding))) << n;
  }
}

TEST(Transformer, IsCausal) {
  // Logits of a prefix equal the first rows of the full sequence's logits.
  const GptOssConfig c = GptOssConfig::tiny();
  const TransformerWeights w = init_transformer_weights(c, DType::f64, RandomInit{24});
  const Tensor full = transformer(kTokens, w, c);
  const std::vector<std::int64_t> prefix(kTokens.begin(), kTokens.begin() + 6);
  // The shorter sequence's GEMMs may block their sums otherwise: f64 in another order.
  const ErrorModel m = model_chain(c, static_cast<std::int64_t>(kTokens.size())).model(DType::f64);
  const Comparison r = compare(full.slice(0, 0, 6), transformer(prefix, w, c), m);
  EXPECT_TRUE(r.passed) << r;
  // The sliding window of layer 0 (4) matters for T > 4: another layer-0 window changes it
  // (by O(1); 1e-6 is far above the f64 chain's rounding, ~1e-13).
  GptOssConfig wide = c;
  wide.sliding_window = 128;
  EXPECT_GT(max_abs_error(full, transformer(kTokens, w, wide)), 1e-6);
}

TEST(Transformer, BadInputThrows) {
  const GptOssConfig c = GptOssConfig::tiny();
  TransformerWeights w = init_transformer_weights(c, DType::f32, ConstantInit{0.5});
  EXPECT_NE(error_of([&] {
              transformer(std::vector<std::int64_t>{1, 128}, w, c);
            }).find("128"),
            std::string::npos);
  EXPECT_THROW(transformer(std::vector<std::int64_t>{-1}, w, c), Error);
  EXPECT_NE(error_of([&] { transformer(std::vector<std::int64_t>{}, w, c); }).find("T = 0"),
            std::string::npos);
  TransformerOptions o;
  o.num_layers = 3;
  EXPECT_THROW(transformer(kTokens, w, c, o), Error);

  TransformerWeights bad = w;
  bad.blocks[1].mlp.mlp1_weight = Tensor(Shape{4, 64, 63}, DType::f32);
  EXPECT_NE(error_of([&] { transformer(kTokens, bad, c); }).find("block.1.mlp"), std::string::npos);
  bad = w;
  bad.blocks[0].attn.out_weight = bad.blocks[0].attn.out_weight.astype(DType::f64);
  const std::string msg = error_of([&] { transformer(kTokens, bad, c); });
  EXPECT_NE(msg.find("block.0.attn"), std::string::npos) << msg;
  EXPECT_NE(msg.find("out.weight"), std::string::npos) << msg;
  bad = w;
  bad.unembedding = Tensor(Shape{c.vocab_size, 32}, DType::f32);
  EXPECT_NE(error_of([&] { transformer(kTokens, bad, c); }).find("unembedding.weight"),
            std::string::npos);
  bad = w;
  bad.blocks.pop_back();
  EXPECT_THROW(transformer(kTokens, bad, c), Error);
  // An f32 model fed through a block with f64 activations.
  EXPECT_THROW(transformer_block(Tensor(Shape{2, c.hidden_size}, DType::f64), w.blocks[0], c, 0),
               Error);
}

}  // namespace test_model
}  // namespace meshtest
