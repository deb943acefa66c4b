// The gpt-oss blocks with their fused ops (AttentionParams::fused, BlockOptions::fused,
// TransformerOptions::fused) against the same blocks with the switch off (the module's unfused
// op sequence is the reference): within the error model of each block (the same terms added in
// another order, bf16 rounded in other places), and bf16 by PCC too; the
// fused blocks run qkv_rope and sdpa_sinks in place of linear + split_qkv + rope and sdpa, and
// experts in place of the router linear + route_top_k + moe_experts + moe_combine.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "src/check/compare.hpp"
#include "src/check/gpt_oss_chains.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/models/transformer.hpp"
#include "src/models/transformer_block.hpp"
#include "src/ops/attention.hpp"
#include "src/ops/moe/moe.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace test_fused_blocks {

/// 130 tokens: more than two of qkv_rope's 64-token panels and of sdpa_sinks' 64-key blocks,
/// and far past the tiny configs' window of 4.
constexpr std::int64_t kTokens = 130;

/// Expects got ~ expected: within the error model `m` with the tensor scale max |expected|
/// (zero-mean random weights and inputs), and in bf16 PCC >= 0.9999 too.
void expect_close(const Tensor& expected, const Tensor& got, const ErrorModel& m,
                  const std::string& label) {
  ASSERT_EQ(got.shape(), expected.shape()) << label;
  ASSERT_EQ(got.dtype(), expected.dtype()) << label;
  const Comparison err = compare(expected, got, m);
  EXPECT_TRUE(err.passed) << label << ": " << err;
  const Comparison p = compare(expected, got, Metric::pcc, 0.9999);
  if (got.dtype() == DType::bf16) {
    EXPECT_TRUE(p.passed) << label << ": " << p.str();
  }
  fmt::print("{}: fused vs unfused error / bound {:.3g} ({}), pcc {:.9f}\n", label, err.value,
             m.str(), p.value);
}

/// The op codes f() records, in order.
template <class F>
std::vector<std::string> op_codes(F&& f) {
  const perf::Session session;
  f();
  std::vector<std::string> out;
  for (const perf::OpRecord& r : perf::records()) out.push_back(r.op_code);
  return out;
}

bool has(const std::vector<std::string>& ops, const std::string& op) {
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

TEST(FusedBlocks, AttentionBlockFusedEqualsUnfused) {
  const GptOssConfig c = GptOssConfig::tiny_tp();
  for (const DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    const Tensor x = random_normal(Shape{kTokens, c.hidden_size}, dtype, {.seed = 5, .stream = 1});
    for (const std::int64_t layer : {0, 1}) {  // 0: sliding window; 1: full causal
      const AttentionWeights w = init_attention_weights(c, layer, dtype, RandomInit{5});
      AttentionParams p = c.attention_params(layer);
      EXPECT_FALSE(p.fused) << "the default is the unfused sequence";
      const Tensor unfused = attention_block(x, w, p);
      p.fused = true;
      expect_close(unfused, attention_block(x, w, p), attention_chain(c, kTokens).model(dtype),
                   fmt::format("attention_block {} layer {}", dtype_name(dtype), layer));
    }
  }
}

TEST(FusedBlocks, FusedAttentionRunsTheFusedOpsOnly) {
  const GptOssConfig c = GptOssConfig::tiny_tp();
  const Tensor x = random_normal(Shape{8, c.hidden_size}, DType::f32, {.seed = 6});
  const AttentionWeights w = init_attention_weights(c, 0, DType::f32, RandomInit{6});
  AttentionParams p = c.attention_params(0);
  const auto unfused = op_codes([&] { attention_block(x, w, p); });
  p.fused = true;
  const auto fused = op_codes([&] { attention_block(x, w, p); });
  for (const char* op : {"split_qkv", "rope", "sdpa"}) {
    EXPECT_FALSE(has(fused, op)) << op << " in the fused block: " << fmt::format("{}", fused);
  }
  EXPECT_TRUE(has(unfused, "sdpa")) << fmt::format("{}", unfused);
  EXPECT_TRUE(has(fused, "qkv_rope")) << fmt::format("{}", fused);
  EXPECT_TRUE(has(fused, "sdpa_sinks")) << fmt::format("{}", fused);
  // rms_norm, qkv_rope, sdpa_sinks, the out linear, the residual add.
  EXPECT_EQ(fused.size(), 5u) << fmt::format("{}", fused);
}

TEST(FusedBlocks, MlpBlockFusedRunsExpertsAndEqualsUnfused) {
  // The fused experts op runs the sequence's GEMMs with the sequence's roundings: equal to the
  // unfused MLP block within the same bounds (bit for bit in the runs seen), recorded as one op.
  const GptOssConfig c = GptOssConfig::tiny_tp();
  for (const DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    const Tensor x = random_normal(Shape{kTokens, c.hidden_size}, dtype, {.seed = 9, .stream = 1});
    const MlpWeights w = init_block_weights(c, 0, dtype, RandomInit{9}).mlp;
    MoeParams p = c.moe_params();
    EXPECT_FALSE(p.fused) << "the default is the unfused sequence";
    const Tensor unfused = mlp_block(x, w, p);
    p.fused = true;
    expect_close(unfused, mlp_block(x, w, p), mlp_chain(c).model(dtype),
                 fmt::format("mlp_block {}", dtype_name(dtype)));
    const auto ops = op_codes([&] { mlp_block(x, w, p); });
    // rms_norm, experts, the residual add.
    EXPECT_EQ(ops, (std::vector<std::string>{"rms_norm", "experts", "add"}))
        << fmt::format("{}", ops);
  }
}

TEST(FusedBlocks, TransformerBlockFusedEqualsUnfused) {
  const GptOssConfig c = GptOssConfig::tiny_tp();
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const Tensor x = random_normal(Shape{kTokens, c.hidden_size}, dtype, {.seed = 7, .stream = 1});
    const BlockWeights w = init_block_weights(c, 0, dtype, RandomInit{7});
    expect_close(transformer_block(x, w, c, 0), transformer_block(x, w, c, 0, {.fused = true}),
                 block_chain(c, kTokens).model(dtype),
                 fmt::format("transformer_block {}", dtype_name(dtype)));
  }
}

TEST(FusedBlocks, TransformerFusedEqualsUnfused) {
  const GptOssConfig c = GptOssConfig::tiny_tp();
  const TransformerWeights w = init_transformer_weights(c, DType::f32, RandomInit{8});
  std::vector<std::int64_t> tokens;
  for (std::int64_t i = 0; i < 20; ++i) tokens.push_back((i * 37) % c.vocab_size);
  const ErrorModel m = model_chain(c, static_cast<std::int64_t>(tokens.size())).model(DType::f32);
  expect_close(transformer(tokens, w, c), transformer(tokens, w, c, {.fused = true}), m,
               "transformer f32");
}

TEST(FusedBlocks, FusedBlockBadWeightsThrowNamingTheTensor) {
  const GptOssConfig c = GptOssConfig::tiny_tp();
  const Tensor x(Shape{3, c.hidden_size}, DType::f32);
  AttentionWeights w = init_attention_weights(c, 0, DType::f32, ConstantInit{0.5});
  w.qkv_weight = Tensor(Shape{7, c.hidden_size}, DType::f32);
  AttentionParams p = c.attention_params(0);
  p.fused = true;
  try {
    attention_block(x, w, p);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qkv.weight"), std::string::npos) << e.what();
  }
}

}  // namespace test_fused_blocks
}  // namespace meshtest
