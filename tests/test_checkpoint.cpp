// gpt-oss checkpoints: write -> read round trips, sliced reads, config.json, bad input.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "src/models/checkpoint.hpp"
#include "src/models/transformer.hpp"
#include "src/ops/mxfp4.hpp"
#include "tests/support/expect_error.hpp"
#include "tests/support/safetensors_edit.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest {
namespace test_checkpoint {

using test_support::expect_error;

namespace fs = std::filesystem;
using Named = test_support::NamedTensors;

const std::vector<std::int64_t> kTokens = {1, 5, 17, 3, 99, 0, 127};

// w with every expert weight replaced by its MXFP4 round trip (what the checkpoint holds).
TransformerWeights quantized(TransformerWeights w) {
  for (BlockWeights& b : w.blocks) {
    b.mlp.mlp1_weight = mxfp4_decode(mxfp4_encode(b.mlp.mlp1_weight), b.mlp.mlp1_weight.dtype());
    b.mlp.mlp2_weight = mxfp4_decode(mxfp4_encode(b.mlp.mlp2_weight), b.mlp.mlp2_weight.dtype());
  }
  return w;
}

// Every tensor of two weight sets, bitwise.
void expect_bitwise_equal(const TransformerWeights& a, const TransformerWeights& b) {
  ASSERT_EQ(a.blocks.size(), b.blocks.size());
  EXPECT_TRUE(a.embedding.bitwise_equal(b.embedding));
  EXPECT_TRUE(a.norm_scale.bitwise_equal(b.norm_scale));
  EXPECT_TRUE(a.unembedding.bitwise_equal(b.unembedding));
  for (std::size_t n = 0; n < a.blocks.size(); ++n) {
    const AttentionWeights &x = a.blocks[n].attn, &y = b.blocks[n].attn;
    const MlpWeights &p = a.blocks[n].mlp, &q = b.blocks[n].mlp;
    for (const auto& [s, t] :
         std::vector<std::pair<const Tensor*, const Tensor*>>{{&x.norm_scale, &y.norm_scale},
                                                              {&x.qkv_weight, &y.qkv_weight},
                                                              {&x.qkv_bias, &y.qkv_bias},
                                                              {&x.sinks, &y.sinks},
                                                              {&x.out_weight, &y.out_weight},
                                                              {&x.out_bias, &y.out_bias},
                                                              {&p.norm_scale, &q.norm_scale},
                                                              {&p.gate_weight, &q.gate_weight},
                                                              {&p.gate_bias, &q.gate_bias},
                                                              {&p.mlp1_weight, &q.mlp1_weight},
                                                              {&p.mlp1_bias, &q.mlp1_bias},
                                                              {&p.mlp2_weight, &q.mlp2_weight},
                                                              {&p.mlp2_bias, &q.mlp2_bias}}) {
      EXPECT_TRUE(s->bitwise_equal(*t)) << "block " << n << ": " << describe(*s);
    }
  }
}

class Checkpoint : public ::testing::Test {
 protected:
  // Writes the tiny random checkpoint in `dtype` and returns the weights written.
  TransformerWeights write_tiny(DType dtype, bool mxfp4 = true) {
    TransformerWeights w = init_transformer_weights(cfg_, dtype, RandomInit{.seed = 11});
    write_checkpoint(dir_, cfg_, w, mxfp4);
    return w;
  }
  // Rewrites model.safetensors after `edit` changes its tensor list.
  void edit(const std::function<void(Named&)>& f) {
    test_support::edit_safetensors(dir_ / "model.safetensors", f);
  }
  static Tensor& find(Named& all, const std::string& name) {
    return test_support::find_tensor(all, name);
  }
  void expect_read_error(const std::vector<std::string>& parts) {
    expect_error([&] { read_checkpoint(dir_, cfg_, DType::f32); }, parts);
  }

  const test_support::TempDir tmp_{"meshtest_ckpt"};
  const fs::path dir_ = tmp_.path();
  GptOssConfig cfg_ = GptOssConfig::tiny();
};

TEST_F(Checkpoint, RoundTripF32MatchesQuantizedWeightsAndLogits) {
  const TransformerWeights w = write_tiny(DType::f32);
  const TransformerWeights r = read_checkpoint(dir_, read_config(dir_), DType::f32);
  const TransformerWeights q = quantized(w);
  expect_bitwise_equal(q, r);
  // The experts really were quantized (so the test above is not vacuous).
  EXPECT_FALSE(w.blocks[0].mlp.mlp1_weight.bitwise_equal(r.blocks[0].mlp.mlp1_weight));
  const Tensor want = transformer(kTokens, q, cfg_), got = transformer(kTokens, r, cfg_);
  EXPECT_TRUE(want.bitwise_equal(got)) << describe(got);
}

TEST_F(Checkpoint, RoundTripBf16AndPlainExperts) {
  const TransformerWeights w = write_tiny(DType::bf16);
  const TransformerWeights r = read_checkpoint(dir_, cfg_, DType::bf16);
  expect_bitwise_equal(quantized(w), r);
  EXPECT_TRUE(
      transformer(kTokens, quantized(w), cfg_).bitwise_equal(transformer(kTokens, r, cfg_)));
  // With bf16 compute a norm scale stored in f32 stays f32 (as the reference keeps it).
  TransformerWeights f32_norm = w;
  f32_norm.norm_scale = random_uniform({64}, DType::f32, {.seed = 5}, 0.5, 1.5);
  write_checkpoint(dir_, cfg_, f32_norm);
  EXPECT_TRUE(
      read_checkpoint(dir_, cfg_, DType::bf16).norm_scale.bitwise_equal(f32_norm.norm_scale));
  // Without MXFP4 every tensor is bit-exact, and f64 reads hold the same values.
  const TransformerWeights plain = write_tiny(DType::f32, /*mxfp4=*/false);
  expect_bitwise_equal(plain, read_checkpoint(dir_, cfg_, DType::f32));
  expect_bitwise_equal(astype(plain, DType::f64), read_checkpoint(dir_, cfg_, DType::f64));
}

TEST_F(Checkpoint, LayerLimitAndTensorsSpreadOverFiles) {
  const TransformerWeights q = quantized(write_tiny(DType::f32));
  // Move the block tensors into a second file.
  Named rest;
  edit([&](Named& all) {
    Named keep;
    for (auto& nt : all) (nt.first.starts_with("block.") ? rest : keep).push_back(std::move(nt));
    all = std::move(keep);
  });
  write_safetensors(dir_ / "model-00002.safetensors", rest);
  const TransformerWeights r = read_checkpoint(dir_, cfg_, DType::f32, {.num_layers = 1});
  ASSERT_EQ(r.blocks.size(), 1u);
  TransformerWeights q1 = q;
  q1.blocks.resize(1);
  expect_bitwise_equal(q1, r);
  expect_bitwise_equal(q, read_checkpoint(dir_, cfg_, DType::f32));
  // The same tensor in two files is an error naming both.
  write_safetensors(dir_ / "model-00003.safetensors", Named{rest.front()});
  expect_read_error({rest.front().first, "model-00002.safetensors", "model-00003.safetensors"});
}

TEST_F(Checkpoint, SlicedReadsEqualSlicesOfFullReads) {
  write_tiny(DType::f32);
  const CheckpointDir ckpt = CheckpointDir::open(dir_);
  EXPECT_TRUE(ckpt.is_mxfp4("block.1.mlp.mlp1_weight"));
  EXPECT_FALSE(ckpt.is_mxfp4("block.1.attn.qkv.weight"));
  EXPECT_EQ(ckpt.shape("block.1.mlp.mlp2_weight"), (Shape{4, 64, 32}));
  struct Case {
    std::string name;
    int dim;
    Range r;
  };
  const std::vector<Case> cases = {
      {"block.0.attn.qkv.weight", 0, {16, 32}}, {"block.0.attn.qkv.weight", 1, {3, 40}},
      {"block.1.attn.sinks", 0, {1, 2}},        {"embedding.weight", -1, {0, 64}},
      {"block.0.mlp.mlp1_weight", 0, {1, 2}},   {"block.0.mlp.mlp1_weight", 1, {8, 16}},
      {"block.0.mlp.mlp1_weight", 2, {32, 32}}, {"block.0.mlp.mlp1_weight", -1, {5, 40}},
      {"block.1.mlp.mlp2_weight", 2, {31, 1}},  {"block.1.mlp.mlp2_weight", 1, {63, 1}},
      {"block.1.mlp.mlp2_weight", 2, {7, 0}},   {"block.1.mlp.mlp1_bias", 1, {2, 20}}};
  for (const Case& c : cases) {
    for (const DType dt : {DType::f32, DType::bf16}) {
      const Tensor full = read_tensor(ckpt, c.name, dt);
      const Tensor part = read_tensor_slice(ckpt, c.name, c.dim, c.r, dt);
      EXPECT_TRUE(part.bitwise_equal(full.slice(c.dim, c.r)))
          << c.name << " dim " << c.dim << " [" << c.r.start << ", +" << c.r.size << ") "
          << describe(part);
    }
  }
  expect_error(
      [&] {
        read_tensor_slice(ckpt, "block.0.mlp.mlp1_weight", 2, {40, 30}, DType::f32);
      },
      {"block.0.mlp.mlp1_weight", "[40, 70)"});
}

TEST_F(Checkpoint, ConfigRoundTripAndBadConfigs) {
  GptOssConfig c = GptOssConfig::tiny();
  c.rope_theta = 12345.5;
  c.sliding_window = 7;
  c.swiglu_limit = 6.5;
  write_config(dir_, c);
  const GptOssConfig r = read_config(dir_);
  EXPECT_EQ(r.num_hidden_layers, c.num_hidden_layers);
  EXPECT_EQ(r.num_experts, c.num_experts);
  EXPECT_EQ(r.experts_per_token, c.experts_per_token);
  EXPECT_EQ(r.vocab_size, c.vocab_size);
  EXPECT_EQ(r.hidden_size, c.hidden_size);
  EXPECT_EQ(r.intermediate_size, c.intermediate_size);
  EXPECT_EQ(r.swiglu_limit, c.swiglu_limit);
  EXPECT_EQ(r.head_dim, c.head_dim);
  EXPECT_EQ(r.num_attention_heads, c.num_attention_heads);
  EXPECT_EQ(r.num_key_value_heads, c.num_key_value_heads);
  EXPECT_EQ(r.sliding_window, c.sliding_window);
  EXPECT_EQ(r.initial_context_length, c.initial_context_length);
  EXPECT_EQ(r.rope_theta, c.rope_theta);
  EXPECT_EQ(r.rope_scaling_factor, c.rope_scaling_factor);
  EXPECT_EQ(r.rope_ntk_alpha, c.rope_ntk_alpha);
  EXPECT_EQ(r.rope_ntk_beta, c.rope_ntk_beta);
  // The published gpt-oss-20b config.json (reference names, integer theta).
  std::ofstream(dir_ / "config.json") << R"({"num_hidden_layers": 24, "num_experts": 32,
    "experts_per_token": 4, "vocab_size": 201088, "hidden_size": 2880,
    "intermediate_size": 2880, "swiglu_limit": 7.0, "head_dim": 64, "num_attention_heads": 64,
    "num_key_value_heads": 8, "sliding_window": 128, "initial_context_length": 4096,
    "rope_theta": 150000, "rope_scaling_factor": 32.0, "rope_ntk_alpha": 1, "rope_ntk_beta": 32})";
  EXPECT_EQ(read_config(dir_).rope_theta, GptOssConfig::gpt_oss_20b().rope_theta);
  std::ofstream(dir_ / "config.json") << R"({"num_hidden_layers": 2})";
  expect_error([&] { read_config(dir_); }, {"config.json", "'num_experts' is missing"});
  std::ofstream(dir_ / "config.json") << "{ not json";
  expect_error([&] { read_config(dir_); }, {"config.json", "does not parse"});
  write_config(dir_, c);
  std::string text;
  {
    std::ifstream in(dir_ / "config.json");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(dir_ / "config.json")
      << std::string(text).replace(text.find("\"head_dim\": 16"), 14, "\"head_dim\": 1.5");
  expect_error([&] { read_config(dir_); }, {"config.json", "head_dim", "integer"});
  fs::remove(dir_ / "config.json");
  expect_error([&] { read_config(dir_); }, {"config.json"});
}

TEST_F(Checkpoint, ConfigLimits) {
  write_config(dir_, GptOssConfig::tiny());
  std::string text;
  {
    std::ifstream in(dir_ / "config.json");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_EQ(parse_config(text, "mem").head_dim, GptOssConfig::tiny().head_dim);
  const auto with = [&](const std::string& field, const std::string& value) {
    std::string t = text;
    const auto at = t.find("\"" + field + "\": ") + field.size() + 4;
    return t.replace(at, t.find_first_of(",\n", at) - at, value);
  };
  // A head_dim of 2^62 would ask the RoPE table for 2^61 entries: refused before that.
  expect_error(
      [&] { parse_config(with("head_dim", "4611686018427387904"), "h.json"); },
      {"gpt-oss config 'h.json'", "head_dim is 4611686018427387904, expected 1 .. 1048576"});
  expect_error([&] { parse_config(with("vocab_size", "1048577"), "v.json"); },
               {"vocab_size is 1048577, expected 1 .. 1048576"});
  expect_error([&] { parse_config(with("hidden_size", "18446744073709551615"), "u.json"); },
               {"'hidden_size' is 18446744073709551615, expected an integer (int64)"});
  expect_error(
      [&] {
        parse_config(with("sliding_window", std::string(80, '[') + std::string(80, ']')), "d.json");
      },
      {"gpt-oss config 'd.json'", "more than 64 deep"});
}

TEST_F(Checkpoint, BadTensorsGiveErrorsNamingThem) {
  write_tiny(DType::f32);
  edit([](Named& all) {
    std::erase_if(all, [](auto& nt) { return nt.first == "block.1.attn.sinks"; });
  });
  expect_read_error({"no tensor 'block.1.attn.sinks'", "holds", "block.1.attn.qkv.weight"});
  write_tiny(DType::f32);
  edit([](Named& all) { find(all, "block.0.attn.sinks") = Tensor({5}, DType::f32); });
  expect_read_error({"block.0.attn.sinks", "[5]", "expected [4]"});
  write_tiny(DType::f32);
  edit([](Named& all) { find(all, "norm.scale") = Tensor({64}, DType::i32); });
  expect_read_error({"norm.scale", "i32", "model.safetensors"});
  write_tiny(DType::f32);
  edit([](Named& all) {
    find(all, "block.1.mlp.mlp2_weight.scales") = Tensor({4, 64, 2}, DType::u8);
  });
  expect_read_error({"block.1.mlp.mlp2_weight", "scales shape [4, 64, 2]", "[4, 64, 1, 16]"});
  write_tiny(DType::f32);
  edit([](Named& all) {
    find(all, "block.0.mlp.mlp1_weight.blocks") = Tensor({4, 64, 2, 16}, DType::f32);
  });
  expect_read_error({"block.0.mlp.mlp1_weight", "u8"});
  write_tiny(DType::f32);
  edit([](Named& all) {
    std::erase_if(all, [](auto& nt) { return nt.first == "block.0.mlp.mlp1_weight.scales"; });
  });
  expect_read_error({"block.0.mlp.mlp1_weight.blocks", "no 'block.0.mlp.mlp1_weight.scales'"});
  // Weights that do not fit the config are refused on write.
  TransformerWeights w = init_transformer_weights(cfg_, DType::f32, ConstantInit{});
  w.blocks.pop_back();
  expect_error([&] { write_checkpoint(dir_, cfg_, w); }, {"blocks"});
}

TEST_F(Checkpoint, CorruptOrMissingFilesGiveErrorsNamingThem) {
  write_tiny(DType::f32);
  const fs::path p = dir_ / "model.safetensors";
  fs::resize_file(p, fs::file_size(p) - 100);
  expect_read_error({"model.safetensors"});
  std::ofstream(p, std::ios::trunc) << "garbage";
  expect_read_error({"model.safetensors"});
  fs::remove(p);
  expect_read_error({"no *.safetensors"});
  expect_error([&] { read_checkpoint(dir_ / "nope", cfg_, DType::f32); }, {"nope", "directory"});
  expect_error([&] { read_checkpoint(dir_, cfg_, DType::i32); }, {"i32"});
}

}  // namespace test_checkpoint
}  // namespace meshtest
