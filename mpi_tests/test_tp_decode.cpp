// test_tp_decode: the tensor-parallel gpt-oss model over KV caches (dist/parallel/tp_decode) on
// every mesh shape of the world, f32 and bf16, unfused and fused: a prefill on empty caches is
// tp_transformer bit for bit; decode steps after a prefill give the whole sequence's next row
// (the single-device transformer() on the sequence so far) within the error model of the TP
// chain, past the sliding window of the even layers; a batch decode of three sequences at
// different positions gives each its next row; on one device decode is the single-device
// transformer_step bit for bit; bad caches throw the same Error on every device and leave the
// caches as they were. Each check prints "PCC <label> mesh <RxC> <pcc> model <error / bound>".
#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "dist/parallel/tp_decode.hpp"
#include "dist/testing/harness/fixtures.hpp"
#include "mpi_tests/support/scale.hpp"
#include "mpi_tests/support/tp_gpt_oss.hpp"
#include "src/models/decode.hpp"
#include "src/models/transformer.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::dist {
namespace {

using test_support::expect_error;
using tp_test::config;
using tp_test::tp_divides;

// 11 tokens: past the sliding window (4) of tiny_tp's even layers.
const std::vector<std::int64_t> kTokens{3, 17, 127, 0, 64, 17, 5, 99, 42, 8, 1};
constexpr std::int64_t kPrefill = 6;

std::span<const std::int64_t> first(const std::vector<std::int64_t>& s, std::int64_t n) {
  return std::span(s).first(static_cast<std::size_t>(n));
}

/// Sequence b of the batch tests: kTokens rotated by 3 b.
std::vector<std::int64_t> sequence(std::size_t b) {
  std::vector<std::int64_t> s = kTokens;
  std::rotate(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(3 * b), s.end());
  return s;
}

class TpDecode : public testing::MeshShapeTest {
 protected:
  void SetUp() override {
    MeshShapeTest::SetUp();
    if (!tp_divides(config(), mesh())) GTEST_SKIP() << "TP size does not divide the heads";
  }
  TpTransformerWeights shard(const TransformerWeights& full) const {
    return shard_transformer_weights(weight_source(full, config()), config(), tp_rank(mesh()));
  }
};

std::string label(const char* what, DType t, bool fused) {
  return fmt::format("{} {}{}", what, dtype_name(t), fused ? " fused" : "");
}

TEST_P(TpDecode, PrefillOnEmptyCachesIsTheTpTransformerBitForBit) {
  const GptOssConfig c = config();
  for (const DType t : {DType::f32, DType::bf16}) {
    for (const bool fused : {false, true}) {
      const TpTransformerWeights w = shard(init_transformer_weights(c, t, RandomInit{21}));
      ModelKvCache cache = tp_kv_cache(mesh(), c, 16, t);
      const Tensor step = tp_transformer_step(mesh(), kTokens, w, c, cache, {.fused = fused});
      const Tensor whole = tp_transformer(mesh(), kTokens, w, c, {.fused = fused});
      EXPECT_TRUE(step.bitwise_equal(whole))
          << label("prefill", t, fused) << " on device " << mesh().device_id();
      EXPECT_EQ(cache.length, static_cast<std::int64_t>(kTokens.size()));
      EXPECT_EQ(cache.layers[0].length(), cache.length);
    }
  }
}

TEST_P(TpDecode, DecodeAfterAPrefillGivesTheWholeSequencesRows) {
  const GptOssConfig c = config();
  const TpRank tp = tp_rank(mesh());
  const auto total = static_cast<std::int64_t>(kTokens.size());
  for (const DType t : {DType::f32, DType::bf16}) {
    for (const bool fused : {false, true}) {
      const TransformerWeights full = init_transformer_weights(c, t, RandomInit{22});
      const TpTransformerWeights w = shard(full);
      ModelKvCache cache = tp_kv_cache(mesh(), c, total, t);
      (void)tp_transformer_step(mesh(), first(kTokens, kPrefill), w, c, cache, {.fused = fused});
      for (std::int64_t i = kPrefill; i < total; ++i) {
        const std::span<const std::int64_t> token =
            std::span(kTokens).subspan(static_cast<std::size_t>(i), 1);
        tp_test::expect_tp_matches_full(
            mesh(), {},
            [&](const std::vector<Tensor>&) {
              return transformer(first(kTokens, i + 1), full, c, {.fused = fused}).slice(0, i, 1);
            },
            [&](const std::vector<Tensor>&) {
              return tp_transformer_step(mesh(), token, w, c, cache, {.fused = fused});
            },
            tp_logits_placements(), model_chain(c, i + 1, tp.size).model(t),
            fmt::format("{} pos {}", label("decode", t, fused), i));
      }
      EXPECT_EQ(cache.length, total);
    }
  }
}

TEST_P(TpDecode, OnOneDeviceDecodeIsTheSingleDeviceStepBitForBit) {
  if (mesh().size() != 1) GTEST_SKIP() << "one device only";
  const GptOssConfig c = config();
  for (const DType t : {DType::f32, DType::bf16}) {
    const TransformerWeights full = init_transformer_weights(c, t, RandomInit{23});
    const TpTransformerWeights w = shard(full);
    ModelKvCache mine = tp_kv_cache(mesh(), c, 16, t);
    ModelKvCache single(c, 16, t);
    for (std::int64_t i = 0; i < 8; ++i) {
      const std::span<const std::int64_t> tokens =
          i == 0 ? first(kTokens, 4)
                 : std::span(kTokens).subspan(static_cast<std::size_t>(i + 3), 1);
      const Tensor a = tp_transformer_step(mesh(), tokens, w, c, mine);
      const Tensor b = transformer_step(tokens, full, c, single);
      EXPECT_TRUE(a.bitwise_equal(b)) << dtype_name(t) << " step " << i;
    }
  }
}

TEST_P(TpDecode, BatchDecodeGivesEachSequencesNextRow) {
  // Three sequences prefilled to 1, 4 and 7 tokens, then two batch steps: the rows split over
  // the token axis like a step's; each against its sequence's row, within the error model of
  // the longest chain of the batch. Weights of seed 26: seed 24 has a routing near tie in bf16
  // (two experts' gate logits closer than bf16 resolves, docs/gpt-oss.md "Precision"), where
  // the TP sums' order changes one row's experts (error / bound 0.72, PCC 0.991 at TP 2 and 4).
  const GptOssConfig c = config();
  const TpRank tp = tp_rank(mesh());
  const std::vector<std::int64_t> prefill{1, 4, 7};
  for (const DType t : {DType::f32, DType::bf16}) {
    for (const bool fused : {false, true}) {
      const TransformerWeights full = init_transformer_weights(c, t, RandomInit{26});
      const TpTransformerWeights w = shard(full);
      std::vector<ModelKvCache> caches;
      for (std::size_t b = 0; b < prefill.size(); ++b) {
        caches.push_back(tp_kv_cache(mesh(), c, 16, t));
        (void)tp_transformer_step(mesh(), first(sequence(b), prefill[b]), w, c, caches.back(),
                                  {.fused = fused});
      }
      for (std::int64_t step = 0; step < 2; ++step) {
        std::vector<std::int64_t> next;
        for (std::size_t b = 0; b < prefill.size(); ++b)
          next.push_back(sequence(b)[static_cast<std::size_t>(prefill[b] + step)]);
        const std::int64_t longest = prefill.back() + step + 1;
        tp_test::expect_tp_matches_full(
            mesh(), {},
            [&](const std::vector<Tensor>&) {
              std::vector<Tensor> rows;
              for (std::size_t b = 0; b < prefill.size(); ++b) {
                const std::int64_t pos = prefill[b] + step;
                rows.push_back(transformer(first(sequence(b), pos + 1), full, c, {.fused = fused})
                                   .slice(0, pos, 1));
              }
              return concat(rows, 0);
            },
            [&](const std::vector<Tensor>&) {
              return tp_transformer_decode(mesh(), next, w, c, caches, {.fused = fused});
            },
            tp_logits_placements(), model_chain(c, longest, tp.size).model(t),
            fmt::format("{} step {}", label("batch", t, fused), step));
      }
      for (std::size_t b = 0; b < prefill.size(); ++b) EXPECT_EQ(caches[b].length, prefill[b] + 2);
    }
  }
}

TEST_P(TpDecode, BadCachesThrowOnEveryDeviceAndLeaveTheCaches) {
  const GptOssConfig c = config();
  const TpTransformerWeights w = shard(init_transformer_weights(c, DType::f32, RandomInit{25}));
  ModelKvCache cache = tp_kv_cache(mesh(), c, 4, DType::f32);
  (void)tp_transformer_step(mesh(), first(kTokens, 3), w, c, cache);
  // Too many tokens for the cache, on every device.
  expect_error([&] { (void)tp_transformer_step(mesh(), first(kTokens, 2), w, c, cache); },
               {"2 tokens after 3 cached do not fit the cache's 4 positions"});
  // The last device alone has a cache of another dtype: every device throws its message.
  const int last = mesh().size() - 1;
  ModelKvCache other =
      tp_kv_cache(mesh(), c, 4, mesh().device_id() == last ? DType::bf16 : DType::f32);
  expect_error([&] { (void)tp_transformer_step(mesh(), first(kTokens, 1), w, c, other); },
               {fmt::format("device {} of {} rejected its input", last, mesh().size()),
                "the cache is bf16, the weights f32"});
  // A single-device cache on a TP axis of more than one device: the kv heads.
  if (mesh().axis_size(1) > 1) {
    ModelKvCache whole(c, 4, DType::f32);
    expect_error([&] { (void)tp_transformer_step(mesh(), first(kTokens, 1), w, c, whole); },
                 {fmt::format("the cache holds {} kv heads, expected {}", c.num_key_value_heads,
                              c.num_key_value_heads / mesh().axis_size(1))});
  }
  std::vector<ModelKvCache> two;
  two.push_back(tp_kv_cache(mesh(), c, 4, DType::f32));
  expect_error([&] { (void)tp_transformer_decode(mesh(), first(kTokens, 2), w, c, two); },
               {"2 tokens for 1 caches"});
  EXPECT_EQ(cache.length, 3);
  EXPECT_EQ(cache.layers[1].length(), 3);
  EXPECT_EQ(other.length, 0);
  EXPECT_EQ(other.layers[0].length(), 0);
}

// Every mesh shape; above 8 ranks the lines and the squarest shapes (support/scale.hpp).
MESHTEST_INSTANTIATE_MESH_SHAPES_AT_SCALE(TpDecode);

}  // namespace
}  // namespace meshtest::dist
