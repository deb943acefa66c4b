// The gpt-oss ops record themselves in the profiler: a transformer block leaves the flat
// sequence of its leaf ops (composite scopes dropped) with shapes, attributes and flops.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/core/random.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/models/transformer_block.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace test_model_perf_records {

TEST(ModelPerfRecords, TransformerBlockRecordsItsLeafOps) {
  const GptOssConfig c = GptOssConfig::tiny();
  const BlockWeights w = init_block_weights(c, 0, DType::f32, RandomInit{1});
  const std::int64_t t = 5;
  const Tensor x = random_normal(Shape{t, c.hidden_size}, DType::f32, {.seed = 2});
  std::vector<perf::OpRecord> recs;
  {
    perf::Session session;
    transformer_block(x, w, c, 0);
    recs = perf::records();
  }
  std::vector<std::string> ops;
  for (const perf::OpRecord& r : recs) ops.push_back(r.op_code);
  const std::vector<std::string> want{
      "rms_norm", "linear",   "rope_table", "apply_rope",  "apply_rope",  "sdpa",        "linear",
      "add",      "rms_norm", "linear",     "route_top_k", "moe_experts", "moe_combine", "add"};
  ASSERT_EQ(ops, want);
  const std::int64_t h = c.hidden_size, d = c.head_dim, heads = c.num_attention_heads;
  const std::int64_t qkv = (heads + 2 * c.num_key_value_heads) * d;
  // qkv projection: 2 T hidden qkv multiply-adds plus T qkv bias adds.
  const perf::OpRecord& proj = recs[1];
  EXPECT_DOUBLE_EQ(proj.flops, static_cast<double>(2 * t * h * qkv + t * qkv));
  EXPECT_EQ(proj.inputs.at(0).shape, (Shape{t, h}));
  EXPECT_EQ(proj.inputs.at(1).shape, (Shape{qkv, h}));
  EXPECT_EQ(proj.outputs.at(0).shape, (Shape{t, qkv}));
  EXPECT_NE(proj.attributes.find("bias=true"), std::string::npos) << proj.attributes;
  // sdpa: q·k and weights·v, 2 T T d each per head.
  EXPECT_DOUBLE_EQ(recs[5].flops, static_cast<double>(4 * t * t * d * heads));
  EXPECT_NE(recs[5].attributes.find("window=4"), std::string::npos) << recs[5].attributes;
  // moe_experts: per (token, chosen expert) 2 h 2I + 2 I h multiply-adds, 2I bias, 10 I swiglu.
  const double slots = static_cast<double>(t * c.experts_per_token);
  const double i = static_cast<double>(c.intermediate_size);
  EXPECT_DOUBLE_EQ(recs[11].flops, slots * (6.0 * static_cast<double>(h) * i + 12.0 * i));
  for (const perf::OpRecord& r : recs) {
    EXPECT_GE(r.end_ns, r.start_ns) << r.op_code;
    EXPECT_EQ(r.op_type, perf::OpType::compute) << r.op_code;
  }
}

TEST(ModelPerfRecords, NothingRecordedWhenProfilingIsOff) {
  perf::clear();
  const GptOssConfig c = GptOssConfig::tiny();
  const BlockWeights w = init_block_weights(c, 1, DType::f32, ConstantInit{0.5});
  transformer_block(random_normal(Shape{3, c.hidden_size}, DType::f32, {.seed = 3}), w, c, 1);
  EXPECT_TRUE(perf::records().empty());
}

}  // namespace test_model_perf_records
}  // namespace meshtest
