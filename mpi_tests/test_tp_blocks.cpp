// test_tp_blocks: tensor-parallel gpt-oss attention, MLP and transformer block against
// the single-device reference, on every mesh shape of the world (TP on axis 1, tokens on axis 0),
// constant (0.5) and seeded random weights, f32 (PCC >= 0.99999) and bf16 (PCC >= 0.99), both
// within the error model of the block's chain (Chain, src/check/tolerance.hpp). At TP
// sizes that do not divide the heads (3) the clear error is expected instead. rms_norm has no TP
// version of its own (it runs per token on the replicated hidden dim): the norms are checked inside
// these blocks and, for the final norm, in test_tp_model.
#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "dist/parallel/tensor_parallel.hpp"
#include "dist/shard/placement.hpp"
#include "dist/testing/harness/fixtures.hpp"
#include "mpi_tests/support/scale.hpp"
#include "mpi_tests/support/tp_gpt_oss.hpp"
#include "src/core/shape.hpp"
#include "src/models/transformer_block.hpp"
#include "src/ops/attention.hpp"
#include "src/ops/moe/moe.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::dist {
namespace {

using test_support::expect_error;
using tp_test::config;
using tp_test::expect_tp_matches;
using tp_test::init_name;
using tp_test::input;
using tp_test::tp_divides;

class TpBlocks : public testing::MeshShapeTest {
 protected:
  /// Calls f(init, dtype, label) for both weight inits and both dtypes.
  template <class F>
  void for_each_case(F&& f) {
    for (const WeightInit& init : {WeightInit{ConstantInit{0.5}}, WeightInit{RandomInit{1}}}) {
      for (const DType dtype : {DType::f32, DType::bf16}) {
        f(init, dtype, fmt::format("{} {}", init_name(init), dtype_name(dtype)));
      }
    }
  }
};

TEST_P(TpBlocks, AttentionMatchesSingleDevice) {
  const GptOssConfig c = config();
  if (!tp_divides(c, mesh())) GTEST_SKIP() << "TP size does not divide the heads: see BadTpSize";
  const TpRank tp = tp_rank(mesh());
  for (const std::int64_t layer : {0, 1}) {  // layer 0: sliding window 4; layer 1: full causal
    for_each_case([&](const WeightInit& init, DType dtype, const std::string& label) {
      const BlockWeights full = init_block_weights(c, layer, dtype, init);
      const AttentionWeights shard =
          shard_attention_weights(weight_source(full, layer), c, layer, tp);
      const AttentionParams p = c.attention_params(layer);
      expect_tp_matches(
          mesh(), input(c, dtype),
          [&](const Tensor& x) { return attention_block(x, full.attn, p); },
          [&](const Tensor& x) { return tp_attention_block(mesh(), x, shard, p); },
          fmt::format("attention L{} {}", layer, label),
          attention_chain(c, tp_test::kTokens, tp.size));
    });
  }
}

TEST_P(TpBlocks, MlpMatchesSingleDevice) {
  const GptOssConfig c = config();
  if (!tp_divides(c, mesh())) GTEST_SKIP() << "TP size does not divide the heads: see BadTpSize";
  const TpRank tp = tp_rank(mesh());
  for_each_case([&](const WeightInit& init, DType dtype, const std::string& label) {
    const BlockWeights full = init_block_weights(c, 0, dtype, init);
    const MlpWeights shard = shard_mlp_weights(weight_source(full, 0), c, 0, tp);
    expect_tp_matches(
        mesh(), input(c, dtype),
        [&](const Tensor& x) { return mlp_block(x, full.mlp, c.moe_params()); },
        [&](const Tensor& x) { return tp_mlp_block(mesh(), x, shard, c.moe_params()); },
        "mlp " + label, mlp_chain(c, tp.size));
  });
}

TEST_P(TpBlocks, TransformerBlockMatchesSingleDevice) {
  const GptOssConfig c = config();
  if (!tp_divides(c, mesh())) GTEST_SKIP() << "TP size does not divide the heads: see BadTpSize";
  const TpRank tp = tp_rank(mesh());
  for_each_case([&](const WeightInit& init, DType dtype, const std::string& label) {
    const BlockWeights full = init_block_weights(c, 0, dtype, init);
    const BlockWeights shard = shard_block_weights(weight_source(full, 0), c, 0, tp);
    expect_tp_matches(
        mesh(), input(c, dtype), [&](const Tensor& x) { return transformer_block(x, full, c, 0); },
        [&](const Tensor& x) { return tp_transformer_block(mesh(), x, shard, c, 0); },
        "block " + label, block_chain(c, tp_test::kTokens, tp.size));
  });
}

TEST_P(TpBlocks, Bf16TracksF32) {
  // Sharded bf16 (bf16 weights and input, f32 norm scales) against the single-device f32 blocks
  // on the same input values (at np 1 the nmse is about half of each bound); on one device the
  // bf16 TP block equals the single-device bf16 block bit for bit. The chains' r roundings and
  // the output's give nmse <= (r + 1)·u²/3 without the residual (attention 12: 6.1e-5, MLP 15:
  // 7.6e-5, block 27: 1.4e-4); the residual x, equal on both sides, brings each under its bound.
  const GptOssConfig c = config();
  if (!tp_divides(c, mesh())) GTEST_SKIP() << "TP size does not divide the heads: see BadTpSize";
  const TpRank tp = tp_rank(mesh());
  const Placements act = tp_activation_placements();
  const auto f32 = [](const std::vector<Tensor>& full) { return full[0].astype(DType::f32); };
  for (const std::int64_t layer : {0, 1}) {
    const BlockWeights w32 = init_block_weights(c, layer, DType::f32, RandomInit{1});
    const BlockWeights w16 = tp_test::bf16_weights(w32);
    const BlockWeights shard = shard_block_weights(weight_source(w16, layer), c, layer, tp);
    const AttentionParams p = c.attention_params(layer);
    const std::vector<testing::ShardedInput> x{{.full = input(c, DType::bf16), .placements = act}};
    tp_test::expect_bf16_tracks_f32(
        mesh(), x, [&](const auto& full) { return attention_block(f32(full), w32.attn, p); },
        [&](const auto& local) { return tp_attention_block(mesh(), local[0], shard.attn, p); }, act,
        4e-5, fmt::format("attention L{}", layer));
    tp_test::expect_bf16_tracks_f32(
        mesh(), x, [&](const auto& full) { return mlp_block(f32(full), w32.mlp, c.moe_params()); },
        [&](const auto& local) {
          return tp_mlp_block(mesh(), local[0], shard.mlp, c.moe_params());
        },
        act, 4e-5, fmt::format("mlp L{}", layer));
    tp_test::expect_bf16_tracks_f32(
        mesh(), x, [&](const auto& full) { return transformer_block(f32(full), w32, c, layer); },
        [&](const auto& local) { return tp_transformer_block(mesh(), local[0], shard, c, layer); },
        act, 8e-5, fmt::format("block L{}", layer));
    if (mesh().size() == 1) {  // one device: the TP block rounds where the single-device one does
      testing::expect_matches_single_device(
          mesh(), x, [&](const auto& full) { return transformer_block(full[0], w16, c, layer); },
          [&](const MeshDevice&, const auto& local) {
            return tp_transformer_block(mesh(), local[0], shard, c, layer);
          },
          act,
          {.metric = Metric::exact, .label = fmt::format("bf16 block L{} on 1 device", layer)});
    }
  }
}

TEST_P(TpBlocks, FewerTokensThanTokenShards) {
  // 2 tokens over up to 16 token shards: most shards are empty; the window and causality still
  // hold (positions are global).
  const GptOssConfig c = config();
  if (!tp_divides(c, mesh())) GTEST_SKIP() << "TP size does not divide the heads: see BadTpSize";
  const BlockWeights full = init_block_weights(c, 0, DType::f32, RandomInit{2});
  const BlockWeights shard = shard_block_weights(weight_source(full, 0), c, 0, tp_rank(mesh()));
  expect_tp_matches(
      mesh(), input(c, DType::f32, 2),
      [&](const Tensor& x) { return transformer_block(x, full, c, 0); },
      [&](const Tensor& x) { return tp_transformer_block(mesh(), x, shard, c, 0); },
      "block T=2 rand f32", block_chain(c, 2, tp_rank(mesh()).size));
}

TEST_P(TpBlocks, AGivenTokenOffsetMatchesAndSavesTheOffsetGather) {
  // The caller passes the position of its first token (as tp_transformer does): the same result,
  // and one all_gather fewer (of the token counts) when the tokens are split.
  const GptOssConfig c = config();
  if (!tp_divides(c, mesh())) GTEST_SKIP() << "TP size does not divide the heads: see BadTpSize";
  const BlockWeights full = init_block_weights(c, 0, DType::f32, RandomInit{8});
  const BlockWeights shard = shard_block_weights(weight_source(full, 0), c, 0, tp_rank(mesh()));
  const std::int64_t offset =
      split_range(tp_test::kTokens, mesh().axis_size(0), mesh().axis_index(0)).start;
  expect_tp_matches(
      mesh(), input(c, DType::f32),
      [&](const Tensor& x) { return transformer_block(x, full, c, 0); },
      [&](const Tensor& x) { return tp_transformer_block(mesh(), x, shard, c, 0, {}, offset); },
      "block given offset rand f32", block_chain(c, tp_test::kTokens, tp_rank(mesh()).size));
  const Tensor x = distribute(input(c, DType::f32), mesh(), tp_activation_placements());
  const std::int64_t kv_gathers = mesh().axis_size(0) > 1 ? 2 : 0;
  EXPECT_EQ(tp_test::count_ccl("all_gather",
                               [&] { tp_transformer_block(mesh(), x, shard, c, 0, {}, offset); }),
            kv_gathers);
  EXPECT_EQ(tp_test::count_ccl("all_gather", [&] { tp_transformer_block(mesh(), x, shard, c, 0); }),
            kv_gathers == 0 ? 0 : kv_gathers + 1);
  // A negative offset on device 0 alone: every device throws.
  const bool first = mesh().device_id() == 0;
  expect_error([&] { tp_transformer_block(mesh(), x, shard, c, 0, {}, first ? -1 : offset); },
               first ? std::vector<std::string>{"token_offset is -1", ">= 0"}
                     : std::vector<std::string>{"device 0"});
}

TEST_P(TpBlocks, ABadShardOnOneDeviceThrowsOnEveryDevice) {
  // Device 0 alone gets misshapen weights: every device throws (no hang), device 0 naming the
  // weight, the others naming device 0.
  const GptOssConfig c = config();
  if (!tp_divides(c, mesh())) GTEST_SKIP() << "TP size does not divide the heads: see BadTpSize";
  const bool first = mesh().device_id() == 0;
  const BlockWeights full = init_block_weights(c, 1, DType::f32, RandomInit{6});
  BlockWeights shard = shard_block_weights(weight_source(full, 1), c, 1, tp_rank(mesh()));
  if (first) shard.attn.sinks = Tensor(Shape{1}, DType::f32);
  if (first) shard.mlp.mlp2_bias = Tensor(Shape{1, 1}, DType::f32);
  const Tensor x = input(c, DType::f32);
  const std::vector<std::string> want =
      first ? std::vector<std::string>{"sinks"} : std::vector<std::string>{"device 0"};
  expect_error([&] { tp_attention_block(mesh(), x, shard.attn, c.attention_params(1)); }, want);
  expect_error([&] { tp_transformer_block(mesh(), x, shard, c, 1); }, want);
  expect_error([&] { tp_mlp_block(mesh(), x, shard.mlp, c.moe_params()); },
               first ? std::vector<std::string>{"mlp2_bias"} : want);
}

TEST_P(TpBlocks, BadTpSizeNamesTheCountAndP) {
  const GptOssConfig c = config();
  const int p = mesh().axis_size(1);
  if (tp_divides(c, mesh())) {
    // Configs with one count that does not split over this mesh's p > 1 devices.
    if (p == 1) GTEST_SKIP() << "every count divides a TP size of 1";
    GptOssConfig odd = c;
    odd.num_attention_heads = 4 * p;  // q heads split, the single kv head does not
    odd.num_key_value_heads = 1;
    expect_error([&] { check_tp_config(odd, p); },
                 {"num_key_value_heads = 1", fmt::format("over {} devices", p)});
    odd.num_attention_heads = 3;
    odd.num_key_value_heads = 3;
    odd.intermediate_size = 3 * 32;
    expect_error([&] { check_tp_config(odd, p); },
                 {"num_attention_heads = 3", fmt::format("over {} devices", p)});
    odd.num_attention_heads = 3 * 16;
    odd.num_key_value_heads = 3 * 8;
    odd.intermediate_size = 33;
    expect_error([&] { check_tp_config(odd, p); },
                 {"intermediate_size = 33", fmt::format("over {} devices", p)});
    return;
  }
  // This mesh's TP size (3, 5, 6, 7, 12, 16, ...) does not divide the 16 q heads or the 8 kv
  // heads: every entry point names the first count that does not split, on every device,
  // before any communication. The MLP's 32 units split at TP 16 but not at 3, 5, 6, 7 or 12.
  const BlockWeights full = init_block_weights(c, 0, DType::f32, ConstantInit{0.5});
  const TpRank tp = tp_rank(mesh());
  const std::vector<std::string> heads = tp_test::tp_split_error(c, p, true, false);
  ASSERT_FALSE(heads.empty());
  expect_error([&] { shard_attention_weights(weight_source(full, 0), c, 0, tp); }, heads);
  expect_error([&] { shard_block_weights(weight_source(full, 0), c, 0, tp); }, heads);
  expect_error([&] { tp_transformer_block(mesh(), input(c, DType::f32), full, c, 0); }, heads);
  expect_error(
      [&] { tp_attention_block(mesh(), input(c, DType::f32), full.attn, c.attention_params(0)); },
      heads);
  const std::vector<std::string> units = tp_test::tp_split_error(c, p, false, true);
  if (units.empty()) {
    EXPECT_EQ(shard_mlp_weights(weight_source(full, 0), c, 0, tp).mlp1_weight.shape()[1],
              2 * c.intermediate_size / p);
  } else {
    expect_error([&] { shard_mlp_weights(weight_source(full, 0), c, 0, tp); }, units);
  }
}

// Every mesh shape; above 8 ranks the lines and the squarest shapes (support/scale.hpp).
MESHTEST_INSTANTIATE_MESH_SHAPES_AT_SCALE(TpBlocks);

}  // namespace
}  // namespace meshtest::dist
