// attention_mask and key_visible against drawn patterns and plain loops; sdpa uses the same rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/ops/attention_mask.hpp"
#include "src/ops/sdpa.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_ops_attention_mask {

using test_support::expect_error;
using Pattern = std::vector<std::string>;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The mask drawn row by row: 'x' where the key is visible (0), '.' where masked (-inf).
Pattern draw(const Tensor& mask) {
  const std::int64_t tq = mask.shape()[0], tk = mask.shape()[1];
  Pattern rows(static_cast<std::size_t>(tq), std::string(static_cast<std::size_t>(tk), '?'));
  for (std::int64_t i = 0; i < tq; ++i) {
    for (std::int64_t j = 0; j < tk; ++j) {
      const double v = mask.item(i * tk + j);
      EXPECT_TRUE(v == 0.0 || v == -kInf) << "(" << i << ", " << j << ") is " << v;
      rows[i][j] = v == 0.0 ? 'x' : '.';
    }
  }
  return rows;
}

// The rule written out for the test: causal, the gpt-oss window (q - k >= window masked), pads.
Pattern naive(std::int64_t tq, std::int64_t tk, bool causal, std::int64_t window,
              std::int64_t q_off, std::int64_t k_off, const std::vector<std::uint8_t>& pad = {}) {
  Pattern rows(static_cast<std::size_t>(tq), std::string(static_cast<std::size_t>(tk), 'x'));
  for (std::int64_t i = 0; i < tq; ++i) {
    for (std::int64_t j = 0; j < tk; ++j) {
      const std::int64_t qp = q_off + i, kp = k_off + j;
      if ((causal && kp > qp) || (window > 0 && qp - kp >= window) || (!pad.empty() && pad[j])) {
        rows[i][j] = '.';
      }
    }
  }
  return rows;
}

static_assert(key_visible(3, 3, {}) && key_visible(3, 0, {}) && !key_visible(3, 4, {}));
static_assert(key_visible(5, 3, {.causal = true, .sliding_window = 3}));
static_assert(!key_visible(5, 2, {.causal = true, .sliding_window = 3}));  // 5 - 2 >= 3
static_assert(key_visible(2, 9, {.causal = false, .sliding_window = 3}));  // future, not causal

TEST(AttentionMask, CausalAndSlidingWindowPatterns) {
  EXPECT_EQ(draw(attention_mask(4, 4, {})), (Pattern{"x...",  //
                                                     "xx..",  //
                                                     "xxx.",  //
                                                     "xxxx"}));
  EXPECT_EQ(draw(attention_mask(6, 6, {.causal = true, .sliding_window = 3})),
            (Pattern{"x.....",  //
                     "xx....",  //
                     "xxx...",  //
                     ".xxx..",  //
                     "..xxx.",  //
                     "...xxx"}));
  EXPECT_EQ(draw(attention_mask(3, 3, {.causal = true, .sliding_window = 1})),
            (Pattern{"x..", ".x.", "..x"}));
  EXPECT_EQ(draw(attention_mask(2, 3, {.causal = false})), (Pattern{"xxx", "xxx"}));
  // Not causal with a window: only keys too far in the past are masked.
  EXPECT_EQ(draw(attention_mask(4, 4, {.causal = false, .sliding_window = 2})),
            (Pattern{"xxxx", "xxxx", ".xxx", "..xx"}));
  // A window larger than T is the causal mask.
  EXPECT_EQ(draw(attention_mask(5, 5, {.causal = true, .sliding_window = 128})),
            draw(attention_mask(5, 5, {})));
  EXPECT_EQ(draw(attention_mask(5, 5, {.causal = true, .sliding_window = 5})),
            draw(attention_mask(5, 5, {})));
}

TEST(AttentionMask, KeyPaddingMasksColumnsForEveryQuery) {
  const std::vector<std::uint8_t> pad{0, 1, 0, 7, 0};                     // nonzero = padding
  EXPECT_EQ(draw(attention_mask(5, 5, {}, 0, 0, pad)), (Pattern{"x....",  //
                                                                "x....",  //
                                                                "x.x..",  //
                                                                "x.x..",  //
                                                                "x.x.x"}));
  EXPECT_EQ(draw(attention_mask(2, 5, {.causal = false}, 0, 0, pad)), (Pattern{"x.x.x", "x.x.x"}));
  // Every key padded: nothing visible.
  EXPECT_EQ(draw(attention_mask(2, 2, {.causal = false}, 0, 0, std::vector<std::uint8_t>{1, 1})),
            (Pattern{"..", ".."}));
}

TEST(AttentionMask, OffsetsAndTqNotTkMatchTheLoop) {
  // Token-sharded queries against gathered keys: query i at q_off + i, key j at k_off + j.
  EXPECT_EQ(draw(attention_mask(2, 6, {.causal = true, .sliding_window = 3}, 4, 0)),
            (Pattern{"..xxx.", "...xxx"}));
  // A decode step: one query at position 9 against the cached window of keys 6 .. 9.
  EXPECT_EQ(draw(attention_mask(1, 4, {.causal = true, .sliding_window = 4}, 9, 6)),
            (Pattern{"xxxx"}));
  // Keys entirely after the queries: all masked.
  EXPECT_EQ(draw(attention_mask(2, 3, {}, 0, 5)), (Pattern{"...", "..."}));
  for (const bool causal : {true, false}) {
    for (const std::int64_t window : {0, 1, 2, 3, 7, 50}) {
      for (const auto& [tq, tk, q_off, k_off] :
           std::vector<std::array<std::int64_t, 4>>{{1, 1, 0, 0},
                                                    {3, 7, 4, 0},
                                                    {7, 3, 0, 4},
                                                    {4, 4, 8, 5},
                                                    {5, 9, 2, 3},
                                                    {2, 6, 10, 2}}) {
        const std::vector<std::uint8_t> pad = [&] {
          std::vector<std::uint8_t> p(static_cast<std::size_t>(tk), 0);
          p[tk / 2] = 1;
          return p;
        }();
        EXPECT_EQ(draw(attention_mask(tq, tk, {causal, window}, q_off, k_off)),
                  naive(tq, tk, causal, window, q_off, k_off))
            << "causal " << causal << " window " << window << " Tq " << tq << " Tk " << tk
            << " offsets " << q_off << ", " << k_off;
        EXPECT_EQ(draw(attention_mask(tq, tk, {causal, window}, q_off, k_off, pad)),
                  naive(tq, tk, causal, window, q_off, k_off, pad));
        // The offset mask is the block of the whole sequence's mask at those offsets.
        const std::int64_t t = std::max(q_off + tq, k_off + tk);
        const Tensor whole = attention_mask(t, t, {causal, window});
        const Tensor part = attention_mask(tq, tk, {causal, window}, q_off, k_off);
        EXPECT_EQ(draw(part), draw(whole.slice(0, q_off, tq).slice(1, k_off, tk)));
      }
    }
  }
}

TEST(AttentionMask, DtypesAndEmpty) {
  const Tensor f64 = attention_mask(3, 3, {}, 0, 0, {}, DType::f64);
  const Tensor b16 = attention_mask(3, 3, {}, 0, 0, {}, DType::bf16);
  EXPECT_EQ(f64.dtype(), DType::f64);
  EXPECT_EQ(b16.dtype(), DType::bf16);
  EXPECT_EQ(draw(f64), draw(attention_mask(3, 3, {})));
  EXPECT_EQ(draw(b16), draw(f64));
  EXPECT_EQ(attention_mask(0, 4, {}).shape(), (Shape{0, 4}));
  EXPECT_EQ(attention_mask(3, 0, {}, 0, 0, {}).shape(), (Shape{3, 0}));
}

TEST(AttentionMask, BadInputThrows) {
  expect_error([] { attention_mask(3, 3, {.causal = true, .sliding_window = -1}); },
               {"attention_mask", "sliding_window", "-1"});
  const std::vector<std::uint8_t> pad{0, 1};
  expect_error([&] { attention_mask(3, 3, {}, 0, 0, pad); },
               {"attention_mask", "key_padding", "2", "Tk = 3"});
  expect_error([] { attention_mask(-1, 3, {}); }, {"attention_mask", "Tq -1"});
  expect_error([] { attention_mask(2, 2, {}, 0, 0, {}, DType::i64); }, {"attention_mask", "i64"});
}

// sdpa (one head, no sink) equals softmax(q·kᵀ·scale + attention_mask) · v: the two use one rule.
TEST(AttentionMask, SdpaAppliesTheSameRule) {
  const std::int64_t d = 4;
  for (const auto& [tq, tk, q_off, k_off, window] : std::vector<std::array<std::int64_t, 5>>{
           {6, 6, 0, 0, 0}, {6, 6, 0, 0, 3}, {2, 8, 6, 0, 3}, {3, 5, 4, 2, 2}, {4, 4, 0, 0, 9}}) {
    const Tensor q = random_normal(Shape{tq, 1, 1, d}, DType::f64, {.seed = 41, .stream = 0});
    const Tensor k = random_normal(Shape{tk, 1, d}, DType::f64, {.seed = 41, .stream = 1});
    const Tensor v = random_normal(Shape{tk, 1, d}, DType::f64, {.seed = 41, .stream = 2});
    const Tensor sinks = Tensor::from_vector(Shape{1}, std::vector<double>{-kInf});
    const Tensor got =
        sdpa(q, k, v, sinks, {.sliding_window = window, .q_offset = q_off, .k_offset = k_off});
    const Tensor mask = attention_mask(tq, tk, {.causal = true, .sliding_window = window}, q_off,
                                       k_off, {}, DType::f64);
    std::vector<double> want(static_cast<std::size_t>(tq * d), 0.0);
    for (std::int64_t i = 0; i < tq; ++i) {
      std::vector<double> w(static_cast<std::size_t>(tk));
      double mx = -kInf, sum = 0;
      for (std::int64_t j = 0; j < tk; ++j) {
        double dot = 0;
        for (std::int64_t c = 0; c < d; ++c) dot += q.item(i * d + c) * k.item(j * d + c);
        w[j] = dot / std::sqrt(double(d)) + mask.item(i * tk + j);
        mx = std::max(mx, w[j]);
      }
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (std::int64_t c = 0; c < d; ++c) {
        for (std::int64_t j = 0; j < tk; ++j) want[i * d + c] += w[j] / sum * v.item(j * d + c);
      }
    }
    // The same sums in another order: q·k over d, the softmax over Tk keys (and the -inf
    // sink's 0), weights·v over Tk keys.
    const Comparison cmp = compare(
        Tensor::from_vector(got.shape(), want), got,
        ErrorModel{
            .dtype = DType::f64, .terms = d + (tk + 1) + tk, .reference = Reference::other_order});
    EXPECT_TRUE(cmp.passed) << "Tq " << tq << " Tk " << tk << " offsets " << q_off << ", " << k_off
                            << " window " << window << ": " << cmp;
  }
}

}  // namespace test_ops_attention_mask
}  // namespace meshtest
