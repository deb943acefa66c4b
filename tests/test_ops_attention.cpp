// sdpa and the attention block against hand values and naive per-head loops.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "src/check/metrics.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/ops/attention.hpp"
#include "src/ops/sdpa.hpp"

namespace meshtest {
namespace test_ops_attention {

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor f64(Shape s, std::vector<double> v) { return Tensor::from_vector(s, v); }

// k or v [T, kv_heads, d] repeated to [T, kv_heads * q_per_kv, d]: head h uses kv head
// h / q_per_kv (the reference's expand).
Tensor repeat_kv(const Tensor& k, std::int64_t q_per_kv) {
  const std::int64_t t = k.shape()[0], g = k.shape()[1], d = k.shape()[2];
  Tensor out(Shape{t, g * q_per_kv, d}, DType::f64);
  for (std::int64_t i = 0; i < t; ++i) {
    for (std::int64_t h = 0; h < g * q_per_kv; ++h) {
      for (std::int64_t c = 0; c < d; ++c) {
        out.span<double>()[(i * g * q_per_kv + h) * d + c] = k.item((i * g + h / q_per_kv) * d + c);
      }
    }
  }
  return out;
}

// Multi-head attention with sinks in double: q [Tq, H, d], k and v [Tk, H, d] -> [Tq, H * d].
std::vector<double> naive_mha(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& sinks, double scale, std::int64_t window,
                              std::int64_t q_off, std::int64_t k_off) {
  const std::int64_t tq = q.shape()[0], heads = q.shape()[1], d = q.shape()[2];
  const std::int64_t tk = k.shape()[0];
  std::vector<double> out(static_cast<std::size_t>(tq * heads * d), 0.0);
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t i = 0; i < tq; ++i) {
      std::vector<double> logit(static_cast<std::size_t>(tk), -kInf);
      double mx = sinks.item(h);
      for (std::int64_t j = 0; j < tk; ++j) {
        const std::int64_t qp = q_off + i, kp = k_off + j;
        if (kp > qp || (window > 0 && qp - kp >= window)) continue;
        double dot = 0;
        for (std::int64_t c = 0; c < d; ++c) {
          dot += q.item((i * heads + h) * d + c) * k.item((j * heads + h) * d + c);
        }
        logit[j] = dot * scale;
        mx = std::max(mx, logit[j]);
      }
      double denom = std::exp(sinks.item(h) - mx);
      for (double l : logit) denom += std::exp(l - mx);
      for (std::int64_t j = 0; j < tk; ++j) {
        const double w = std::exp(logit[j] - mx) / denom;
        for (std::int64_t c = 0; c < d; ++c) {
          out[(i * heads + h) * d + c] += w * v.item((j * heads + h) * d + c);
        }
      }
    }
  }
  return out;
}

SdpaOptions options(std::int64_t window, std::int64_t q_off = 0, std::int64_t k_off = 0) {
  return {.sliding_window = window, .q_offset = q_off, .k_offset = k_off};
}

// Closed forms through a few std::exp, sums of at most 3 terms and quotients: the tolerances are
// 4 to 11 ulps of the values (2.0 is exact: weights of 1/2).
TEST(Sdpa, SinkSoftmaxHandValues) {
  SdpaOptions o = options(0);
  o.scale = 1.0;
  // One position: logit ln 3, sink 0 -> weight 3/4 on v = 2.
  const Tensor y = sdpa(f64({1, 1, 1, 1}, {1}), f64({1, 1, 1}, {std::log(3.0)}),
                        f64({1, 1, 1}, {2}), f64({1}, {0}), o);
  EXPECT_NEAR(y.item(0), 1.5, 1e-15);
  // Query at position 1 sees logits 0 and ln 2, sink 0: weights 1/4, 2/4 -> 4/4 + 16/4 = 5.
  const Tensor k = f64({2, 1, 1}, {0, std::log(2.0)});
  const Tensor v = f64({2, 1, 1}, {4, 8});
  o.q_offset = 1;
  EXPECT_NEAR(sdpa(f64({1, 1, 1, 1}, {1}), k, v, f64({1}, {0}), o).item(0), 5.0, 1e-14);
  // A -inf sink is ordinary softmax: weights 1/3, 2/3 -> 20/3.
  EXPECT_NEAR(sdpa(f64({1, 1, 1, 1}, {1}), k, v, f64({1}, {-kInf}), o).item(0), 20.0 / 3, 1e-14);
  // Query at position 0 sees only key 0 (causal): weight 1/2 -> 2.
  o.q_offset = 0;
  EXPECT_NEAR(sdpa(f64({1, 1, 1, 1}, {1}), k, v, f64({1}, {0}), o).item(0), 2.0, 1e-15);
}

TEST(Sdpa, WindowOneSeesOnlyItself) {
  const Tensor q = random_normal(Shape{5, 2, 2, 4}, DType::f64, {.seed = 8, .stream = 0});
  const Tensor k = random_normal(Shape{5, 2, 4}, DType::f64, {.seed = 8, .stream = 1});
  const Tensor v = random_normal(Shape{5, 2, 4}, DType::f64, {.seed = 8, .stream = 2});
  const Tensor sinks = f64({4}, {-kInf, -kInf, -kInf, -kInf});
  const Tensor y = sdpa(q, k, v, sinks, options(1));
  for (std::int64_t t = 0; t < 5; ++t) {
    for (std::int64_t h = 0; h < 4; ++h) {
      for (std::int64_t c = 0; c < 4; ++c) {
        EXPECT_EQ(y.item((t * 4 + h) * 4 + c), v.item((t * 2 + h / 2) * 4 + c)) << t << h << c;
      }
    }
  }
}

TEST(Sdpa, CausalOutputIgnoresLaterKeys) {
  const Tensor q = random_normal(Shape{6, 1, 2, 8}, DType::f32, {.seed = 9, .stream = 0});
  Tensor k = random_normal(Shape{6, 1, 8}, DType::f32, {.seed = 9, .stream = 1});
  Tensor v = random_normal(Shape{6, 1, 8}, DType::f32, {.seed = 9, .stream = 2});
  const Tensor sinks = random_normal(Shape{2}, DType::f32, {.seed = 9, .stream = 3});
  const Tensor before = sdpa(q, k, v, sinks);
  k.assign_slice(0, 3, random_normal(Shape{3, 1, 8}, DType::f32, {.seed = 9, .stream = 4}));
  v.assign_slice(0, 3, random_normal(Shape{3, 1, 8}, DType::f32, {.seed = 9, .stream = 5}));
  const Tensor after = sdpa(q, k, v, sinks);
  EXPECT_TRUE(before.slice(0, 0, 3).bitwise_equal(after.slice(0, 0, 3)));
  EXPECT_FALSE(before.slice(0, 3, 3).bitwise_equal(after.slice(0, 3, 3)));
}

struct SdpaCase {
  std::int64_t kv_heads, q_per_kv, window;
};

TEST(Sdpa, MatchesNaiveRepeatKvImplementation) {
  // GQA (kv_heads < heads) and MHA, with and without a sliding window.
  for (const SdpaCase c :
       {SdpaCase{2, 3, 0}, SdpaCase{2, 3, 3}, SdpaCase{3, 1, 0}, SdpaCase{1, 4, 2}}) {
    const std::int64_t T = 7, d = 8, heads = c.kv_heads * c.q_per_kv;
    for (DType dt : {DType::f64, DType::f32}) {
      const Tensor q =
          random_normal(Shape{T, c.kv_heads, c.q_per_kv, d}, dt, {.seed = 10, .stream = 0});
      const Tensor k = random_normal(Shape{T, c.kv_heads, d}, dt, {.seed = 10, .stream = 1});
      const Tensor v = random_normal(Shape{T, c.kv_heads, d}, dt, {.seed = 10, .stream = 2});
      const Tensor s = random_normal(Shape{heads}, dt, {.seed = 10, .stream = 3});
      const Tensor y = sdpa(q, k, v, s, options(c.window));
      ASSERT_EQ(y.shape(), (Shape{T, heads * d}));
      const Tensor q64 = q.astype(DType::f64).reshape(Shape{T, heads, d});
      const auto want = naive_mha(q64, repeat_kv(k.astype(DType::f64), c.q_per_kv),
                                  repeat_kv(v.astype(DType::f64), c.q_per_kv), s.astype(DType::f64),
                                  1 / std::sqrt(8.0), c.window, 0, 0);
      // Per element: q·k over d, the softmax over T keys and the sink, weights·v over T keys;
      // f32 against the loops in f64 on the same inputs, f64 against them in another order.
      const ErrorModel m{.dtype = dt,
                         .terms = d + (T + 1) + T,
                         .reference = dt == DType::f64 ? Reference::other_order : Reference::exact};
      const Comparison cmp = compare(Tensor::from_vector(y.shape(), want), y, m);
      EXPECT_TRUE(cmp.passed) << "kv_heads " << c.kv_heads << " q_per_kv " << c.q_per_kv
                              << " window " << c.window << " " << dtype_name(dt) << ": " << cmp;
    }
  }
}

TEST(Sdpa, TokenShardOffsetsMatchTheFullSequence) {
  const std::int64_t T = 7, d = 8;
  const Tensor q = random_normal(Shape{T, 2, 2, d}, DType::f64, {.seed = 11, .stream = 0});
  const Tensor k = random_normal(Shape{T, 2, d}, DType::f64, {.seed = 11, .stream = 1});
  const Tensor v = random_normal(Shape{T, 2, d}, DType::f64, {.seed = 11, .stream = 2});
  const Tensor s = random_normal(Shape{4}, DType::f64, {.seed = 11, .stream = 3});
  // GEMMs of other sizes may add in another order: q·k over d, the softmax over at most T keys
  // and the sink, weights·v over T keys.
  const ErrorModel m{
      .dtype = DType::f64, .terms = d + (T + 1) + T, .reference = Reference::other_order};
  for (std::int64_t window : {0, 3}) {
    const Tensor full = sdpa(q, k, v, s, options(window));
    // Queries 4..6 against all keys.
    const Tensor shard = sdpa(q.slice(0, 4, 3), k, v, s, options(window, 4, 0));
    const Comparison c = compare(full.slice(0, 4, 3), shard, m);
    EXPECT_TRUE(c.passed) << "window " << window << ": " << c;
    // Queries 4..6 against keys 2..6 (enough for window 3).
    if (window == 3) {
      const Tensor part =
          sdpa(q.slice(0, 4, 3), k.slice(0, 2, 5), v.slice(0, 2, 5), s, options(window, 4, 2));
      const Comparison cp = compare(full.slice(0, 4, 3), part, m);
      EXPECT_TRUE(cp.passed) << "keys 2..6: " << cp;
    }
  }
  // An empty query shard is legal.
  EXPECT_EQ(sdpa(q.slice(0, 0, 0), k, v, s, options(0, 7, 0)).shape(), (Shape{0, 32}));
}

TEST(Sdpa, BadInputThrows) {
  const Tensor q(Shape{3, 2, 2, 4}, DType::f32);
  const Tensor k(Shape{3, 2, 4}, DType::f32);
  const Tensor s(Shape{4}, DType::f32);
  EXPECT_THROW(sdpa(q.reshape(Shape{3, 4, 4}), k, k, s), Error);
  EXPECT_THROW(sdpa(q, Tensor(Shape{3, 1, 4}, DType::f32), k, s), Error);
  EXPECT_THROW(sdpa(q, k, Tensor(Shape{2, 2, 4}, DType::f32), s), Error);
  EXPECT_THROW(sdpa(q, k, k, Tensor(Shape{2}, DType::f32)), Error);
  EXPECT_THROW(sdpa(q, k.astype(DType::f64), k, s), Error);
  EXPECT_THROW(sdpa(q, k, k, s, options(-1)), Error);
}

// The attention block composed here from loops: norm, qkv, RoPE, naive sdpa, out, residual.
std::vector<double> naive_attention_block(const Tensor& x, const AttentionWeights& w,
                                          const AttentionParams& p) {
  const std::int64_t T = x.shape()[0], H = x.shape()[1];
  const std::int64_t nh = p.num_heads, kvh = p.num_kv_heads, d = p.head_dim;
  const std::int64_t qkv_dim = (nh + 2 * kvh) * d;
  std::vector<double> qkv(static_cast<std::size_t>(T * qkv_dim));
  for (std::int64_t t = 0; t < T; ++t) {
    double ms = 0;
    for (std::int64_t i = 0; i < H; ++i) ms += x.item(t * H + i) * x.item(t * H + i) / H;
    for (std::int64_t o = 0; o < qkv_dim; ++o) {
      double acc = w.qkv_bias.item(o);
      for (std::int64_t i = 0; i < H; ++i) {
        const double n = x.item(t * H + i) / std::sqrt(ms + p.norm_eps) * w.norm_scale.item(i);
        acc += n * w.qkv_weight.item(o * H + i);
      }
      qkv[t * qkv_dim + o] = acc;
    }
  }
  const YarnFrequencies f = yarn_frequencies(p.rope);
  Tensor q(Shape{T, nh, d}, DType::f64), k(Shape{T, kvh, d}, DType::f64), v = k;
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t h = 0; h < nh + 2 * kvh; ++h) {
      for (std::int64_t c = 0; c < d; ++c) {
        double val = qkv[t * qkv_dim + h * d + c];
        if (h < nh + kvh) {  // q and k heads rotate
          const std::int64_t j = c % (d / 2);
          const double a = t * f.inv_freq[j];
          const double other = qkv[t * qkv_dim + h * d + (c < d / 2 ? c + d / 2 : c - d / 2)];
          val = c < d / 2 ? val * std::cos(a) - other * std::sin(a)
                          : val * std::cos(a) + other * std::sin(a);
          val *= f.concentration;
        }
        if (h < nh)
          q.span<double>()[(t * nh + h) * d + c] = val;
        else if (h < nh + kvh)
          k.span<double>()[(t * kvh + h - nh) * d + c] = val;
        else
          v.span<double>()[(t * kvh + h - nh - kvh) * d + c] = val;
      }
    }
  }
  const auto attn = naive_mha(q, repeat_kv(k, nh / kvh), repeat_kv(v, nh / kvh), w.sinks,
                              1 / std::sqrt(static_cast<double>(d)), p.sliding_window, 0, 0);
  std::vector<double> out(static_cast<std::size_t>(T * H));
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t o = 0; o < H; ++o) {
      double acc = x.item(t * H + o) + w.out_bias.item(o);
      for (std::int64_t i = 0; i < nh * d; ++i)
        acc += attn[t * nh * d + i] * w.out_weight.item(o * nh * d + i);
      out[t * H + o] = acc;
    }
  }
  return out;
}

TEST(AttentionBlock, MatchesNaiveCompositionOnEvenAndOddLayers) {
  const GptOssConfig c = GptOssConfig::tiny();
  const Tensor x = random_normal(Shape{9, c.hidden_size}, DType::f64, {.seed = 12, .stream = 0});
  for (std::int64_t layer : {0, 1}) {
    const AttentionParams p = c.attention_params(layer);
    EXPECT_EQ(p.sliding_window, layer == 0 ? 4 : 0);
    const AttentionWeights w = init_attention_weights(c, layer, DType::f64, RandomInit{12});
    const Tensor y = attention_block(x, w, p);
    const std::int64_t T = x.shape()[0];
    // Per output element, the chain's sums: the norm's squares and the qkv projection (and its
    // bias), RoPE's two-term rotation, sdpa (q·k, the softmax over T keys and the sink,
    // weights·v), the out projection, its bias and the residual.
    const ErrorModel m{.dtype = DType::f64,
                       .terms = (2 * c.hidden_size + 1) + 2 + (c.head_dim + (T + 1) + T) +
                                (c.num_attention_heads * c.head_dim + 2),
                       .reference = Reference::other_order};
    const Comparison cmp =
        compare(Tensor::from_vector(y.shape(), naive_attention_block(x, w, p)), y, m);
    EXPECT_TRUE(cmp.passed) << "layer " << layer << ": " << cmp;
  }
}

TEST(AttentionBlock, ConstantInitFiniteAndBf16TracksF32) {
  const GptOssConfig c = GptOssConfig::tiny();
  const Tensor x = random_normal(Shape{6, c.hidden_size}, DType::f32, {.seed = 13, .stream = 0});
  const AttentionWeights half = init_attention_weights(c, 0, DType::f32, ConstantInit{0.5});
  const Tensor y = attention_block(x, half, c.attention_params(0));
  for (std::int64_t i = 0; i < y.numel(); ++i) ASSERT_TRUE(std::isfinite(y.item(i))) << i;
  const AttentionWeights w32 = init_attention_weights(c, 0, DType::f32, RandomInit{13});
  const AttentionWeights w16 = init_attention_weights(c, 0, DType::bf16, RandomInit{13});
  const Tensor y32 = attention_block(x, w32, c.attention_params(0));
  const Tensor y16 = attention_block(x.astype(DType::bf16), w16, c.attention_params(0));
  EXPECT_EQ(y16.dtype(), DType::bf16);
  // About a dozen bf16 roundings (x, the weights, each op's output) give nmse ≈ 12 u²/3 ≈ 6e-5
  // (u = 2^-8) and 1 - pcc ≈ nmse / 2 ≈ 3e-5: 0.999 leaves 30x for the softmax's amplification.
  EXPECT_GE(pcc(y32, y16), 0.999);
}

TEST(AttentionBlock, BadWeightsThrowNamingTheTensor) {
  const GptOssConfig c = GptOssConfig::tiny();
  const Tensor x(Shape{3, c.hidden_size}, DType::f32);
  AttentionWeights w = init_attention_weights(c, 1, DType::f32, ConstantInit{0.5});
  w.qkv_bias = Tensor(Shape{7}, DType::f32);
  try {
    attention_block(x, w, c.attention_params(1));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qkv.bias"), std::string::npos) << e.what();
  }
  w = init_attention_weights(c, 1, DType::f32, ConstantInit{0.5});
  w.sinks = w.sinks.astype(DType::f64);
  EXPECT_THROW(attention_block(x, w, c.attention_params(1)), Error);
  w = init_attention_weights(c, 1, DType::f32, ConstantInit{0.5});
  AttentionParams p = c.attention_params(1);
  p.num_kv_heads = 3;  // 4 heads are not a multiple of 3
  EXPECT_THROW(attention_block(x, w, p), Error);
  EXPECT_THROW(attention_block(Tensor(Shape{3, 8}, DType::f32), w, c.attention_params(1)), Error);
}

}  // namespace test_ops_attention
}  // namespace meshtest
