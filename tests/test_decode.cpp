// transformer_step: the gpt-oss model over a KV cache. A prefill on an empty cache is
// transformer() bit for bit; decode steps of one token after a prefill of N give the logits of
// the whole sequence's rows N, N+1, ... within the error model of the chain (model_chain: the
// same sums, a one-row product in another order), past the sliding window of the even layers,
// f32 and bf16, unfused and fused; bad steps are Errors that leave the cache as it was.
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "src/check/gpt_oss_chains.hpp"
#include "src/check/tolerance.hpp"
#include "src/models/decode.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/models/transformer.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace {

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

}  // namespace
}  // namespace meshtest
