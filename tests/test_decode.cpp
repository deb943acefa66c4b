// transformer_step: the gpt-oss model over a KV cache. A prefill on an empty cache is
// transformer() bit for bit; decode steps of one token after a prefill of N give the logits of
// the whole sequence's rows N, N+1, ... within the error model of the chain (model_chain: the
// same sums, a one-row product in another order), past the sliding window of the even layers,
// f32 and bf16, unfused and fused; bad steps are Errors that leave the cache as it was. A batch
// decode (transformer_decode: one token for each of several sequences at their own positions)
// gives each sequence's next row within the same error model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "src/check/gpt_oss_chains.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/models/decode.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/models/transformer.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_decode {

using test_support::expect_error;

// 9 tokens: past the sliding window (4) of tiny_tp's even layers.
const std::vector<std::int64_t> kTokens{3, 17, 99, 42, 5, 127, 64, 8, 1};

std::span<const std::int64_t> first(std::int64_t n) {
  return std::span(kTokens).first(static_cast<std::size_t>(n));
}

TEST(Decode, PrefillOnAnEmptyCacheIsTheTransformerBitForBit) {
  const GptOssConfig c = GptOssConfig::tiny_tp();
  for (const DType t : {DType::f32, DType::bf16}) {
    const TransformerWeights w = init_transformer_weights(c, t, RandomInit{11});
    ModelKvCache cache(c, 16, t);
    const Tensor got = transformer_step(kTokens, w, c, cache);
    EXPECT_TRUE(got.bitwise_equal(transformer(kTokens, w, c))) << dtype_name(t);
    const auto total = static_cast<std::int64_t>(kTokens.size());
    EXPECT_EQ(cache.length, total);
    ASSERT_EQ(static_cast<std::int64_t>(cache.layers.size()), c.num_hidden_layers);
    EXPECT_EQ(cache.layers[0].length(), total);
  }
}

TEST(Decode, DecodeStepsAfterAPrefillGiveTheWholeSequencesRows) {
  const GptOssConfig c = GptOssConfig::tiny_tp();
  const auto total = static_cast<std::int64_t>(kTokens.size());
  for (const DType t : {DType::f32, DType::bf16}) {
    for (const bool fused : {false, true}) {
      const TransformerWeights w = init_transformer_weights(c, t, RandomInit{12});
      const Tensor whole = transformer(kTokens, w, c, {.fused = fused});
      for (const std::int64_t n : {1, 4, 7}) {
        ModelKvCache cache(c, total, t);
        (void)transformer_step(first(n), w, c, cache, {.fused = fused});
        for (std::int64_t i = n; i < total; ++i) {
          const Tensor row =
              transformer_step(std::span(kTokens).subspan(static_cast<std::size_t>(i), 1), w, c,
                               cache, {.fused = fused});
          const ErrorModel model = model_chain(c, i + 1).model(t);
          const Comparison cmp = compare(whole.slice(0, i, 1), row, model);
          EXPECT_TRUE(cmp.passed) << dtype_name(t) << (fused ? " fused" : "") << ": prefill " << n
                                  << ", decode of token " << i << " (" << model.str()
                                  << "): " << cmp.str();
        }
        EXPECT_EQ(cache.length, total);
      }
    }
  }
}

/// Sequence b of the batch tests: kTokens rotated by 2 b (each sequence its own tokens).
std::vector<std::int64_t> sequence(std::size_t b) {
  std::vector<std::int64_t> s = kTokens;
  std::rotate(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(2 * b), s.end());
  return s;
}

TEST(Decode, BatchDecodeGivesEachSequencesNextRow) {
  // Three sequences prefilled to 1, 4 and 7 tokens (layer 0's window is 4: the third reads past
  // it), then two batch steps of one token each: row b of a step equals the whole sequence's
  // row at its position, within the chain's error model at that length.
  const GptOssConfig c = GptOssConfig::tiny_tp();
  const std::vector<std::int64_t> prefill{1, 4, 7};
  for (const DType t : {DType::f32, DType::bf16}) {
    for (const bool fused : {false, true}) {
      const TransformerWeights w = init_transformer_weights(c, t, RandomInit{14});
      std::vector<ModelKvCache> caches;
      for (std::size_t b = 0; b < prefill.size(); ++b) {
        caches.emplace_back(c, 16, t);
        const std::vector<std::int64_t> s = sequence(b);
        (void)transformer_step(std::span(s).first(static_cast<std::size_t>(prefill[b])), w, c,
                               caches.back(), {.fused = fused});
      }
      for (std::int64_t step = 0; step < 2; ++step) {
        std::vector<std::int64_t> next;
        for (std::size_t b = 0; b < prefill.size(); ++b)
          next.push_back(sequence(b)[static_cast<std::size_t>(prefill[b] + step)]);
        const Tensor rows = transformer_decode(next, w, c, caches, {.fused = fused});
        ASSERT_EQ(rows.shape(), (Shape{3, c.vocab_size}));
        for (std::size_t b = 0; b < prefill.size(); ++b) {
          const std::int64_t pos = prefill[b] + step;
          const std::vector<std::int64_t> s = sequence(b);
          const Tensor whole = transformer(std::span(s).first(static_cast<std::size_t>(pos + 1)), w,
                                           c, {.fused = fused});
          const ErrorModel model = model_chain(c, pos + 1).model(t);
          const Comparison cmp = compare(whole.slice(0, pos, 1),
                                         rows.slice(0, static_cast<std::int64_t>(b), 1), model);
          EXPECT_TRUE(cmp.passed) << dtype_name(t) << (fused ? " fused" : "") << ": sequence " << b
                                  << " at position " << pos << " (" << model.str()
                                  << "): " << cmp.str();
          EXPECT_EQ(caches[b].length, pos + 1);
        }
      }
    }
  }
}

TEST(Decode, BadBatchesAreErrorsThatLeaveTheCaches) {
  const GptOssConfig c = GptOssConfig::tiny_tp();
  const TransformerWeights w = init_transformer_weights(c, DType::f32, RandomInit{15});
  std::vector<ModelKvCache> caches;
  caches.emplace_back(c, 4, DType::f32);
  caches.emplace_back(c, 2, DType::f32);
  (void)transformer_step(first(2), w, c, caches[1]);
  const std::vector<std::int64_t> one{5}, two{5, 6};
  expect_error([&] { (void)transformer_decode(one, w, c, caches); },
               {"1 tokens for 2 caches, expected one token per cache"});
  expect_error([&] { (void)transformer_decode(two, w, c, caches); },
               {"1 tokens after 2 cached do not fit the cache's (sequence 1) 2 positions"});
  std::vector<ModelKvCache> mixed;
  mixed.emplace_back(c, 4, DType::f32);
  mixed.emplace_back(c, 4, DType::f32, 1);
  expect_error([&] { (void)transformer_decode(two, w, c, mixed); },
               {"the cache (sequence 1) holds 1 layers, the first 2"});
  EXPECT_EQ(caches[0].length, 0);
  EXPECT_EQ(caches[0].layers[0].length(), 0);
  EXPECT_EQ(caches[1].length, 2);
  expect_error([&] { ModelKvCache(c, 4, DType::f32, -1, c.num_key_value_heads + 1); },
               {"kv_heads is 9, expected -1 (all) or 1 .. 8"});
}

TEST(Decode, BadSegmentsAreErrorsBeforeAnyWrite) {
  const GptOssConfig c = GptOssConfig::tiny_tp();
  const AttentionParams p = c.attention_params(1);
  const AttentionWeights w = init_attention_weights(c, 1, DType::f32, RandomInit{16});
  const Tensor x = random_normal(Shape{3, c.hidden_size}, DType::f32, {.seed = 1});
  KvCache a(8, c.num_key_value_heads, c.head_dim, DType::f32);
  KvCache narrow(8, 1, c.head_dim, DType::f32);
  const auto run = [&](std::vector<CacheSegment> s) { (void)cached_attention_block(x, w, p, s); };
  expect_error([&] { run({{.cache = &a, .first = 0, .rows = 2}}); },
               {"the segments hold 2 rows, x has 3"});
  expect_error([&] { run({{.cache = &a, .first = 1, .rows = 3}}); },
               {"segment 0 has 3 rows at position 1", "[0, 0]"});
  expect_error(
      [&] {
        run({{.cache = &a, .first = 0, .rows = 1}, {.cache = &a, .first = 0, .rows = 2}});
      },
      {"segments 0 and 1 share a cache"});
  expect_error([&] { run({{.cache = &narrow, .first = 0, .rows = 3}}); },
               {"segment 0's cache holds 1 kv heads of 8 in f32, expected 8 of 8 in f32"});
  expect_error([&] { run({{.cache = nullptr, .first = 0, .rows = 3}}); },
               {"segment 0 has no cache"});
  EXPECT_EQ(a.length(), 0);
}

TEST(Decode, BadStepsAreErrorsThatLeaveTheCache) {
  const GptOssConfig c = GptOssConfig::tiny_tp();
  const TransformerWeights w = init_transformer_weights(c, DType::f32, RandomInit{13});
  ModelKvCache cache(c, 4, DType::f32, 1);
  (void)transformer_step(first(3), w, c, cache);
  const std::vector<std::int64_t> none;
  expect_error([&] { (void)transformer_step(none, w, c, cache); }, {"no tokens given (T = 0)"});
  expect_error([&] { (void)transformer_step(first(1), w, c, cache, {.num_layers = 2}); },
               {"the cache holds 1 layers, but num_layers is 2"});
  expect_error([&] { (void)transformer_step(first(2), w, c, cache); },
               {"2 tokens after 3 cached do not fit the cache's 4 positions"});
  const std::vector<std::int64_t> bad{c.vocab_size};
  expect_error([&] { (void)transformer_step(bad, w, c, cache); }, {"128"});
  const TransformerWeights w16 = init_transformer_weights(c, DType::bf16, RandomInit{13});
  expect_error([&] { (void)transformer_step(first(1), w16, c, cache); },
               {"the cache is f32, the weights bf16"});
  EXPECT_EQ(cache.length, 3);
  EXPECT_EQ(cache.layers[0].length(), 3);
  expect_error([] { ModelKvCache(GptOssConfig::tiny_tp(), 4, DType::f32, 3); },
               {"num_layers is 3, expected -1 (all) or 0 .. 2"});
}

}  // namespace test_decode
}  // namespace meshtest
