// swiglu, the router and the MoE MLP block against closed forms and naive loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "src/check/metrics.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/ops/activations.hpp"
#include "src/ops/moe/moe.hpp"

namespace meshtest {
namespace test_ops_moe {

double sigmoid(double z) { return 1 / (1 + std::exp(-z)); }

// swiglu of one (glu, lin) pair, from the published definition.
double swiglu_ref(double glu, double lin) {
  glu = std::min(glu, 7.0);
  lin = std::max(-7.0, std::min(lin, 7.0));
  return glu * sigmoid(1.702 * glu) * (lin + 1);
}

// 8 ulps of `want` in f64: swiglu and the router's softmax are a few std::exp, sums of at most
// 3 terms, quotients and products, each within an ulp or two on any processor (FMA may fuse a
// product into a sum).
double ulps8(double want) { return 8 * std::ldexp(std::abs(want), -52); }

TEST(Swiglu, ClampEdgesAndInterleavedColumns) {
  // Pairs (x_glu, x_lin) at even/odd columns.
  const std::vector<double> pairs{8,    0,    // glu clamps to 7
                                  7,    0,    // the edge itself
                                  1e3,  0.5,  // far above the clamp
                                  1,    -8,   // lin clamps to -7: 1·σ(1.702)·(-6)
                                  1,    8,    // lin clamps to 7
                                  -20,  0,    // glu has no lower clamp
                                  0,    0,    // zero
                                  1e-3, -1e-3, -1e-3, 3, 2, -1};  // lin + 1 = 0
  const Tensor x = Tensor::from_vector(Shape{2, 10}, pairs);
  const Tensor y = swiglu(x);
  ASSERT_EQ(y.shape(), (Shape{2, 5}));
  for (int i = 0; i < 10; ++i) {
    const double want = swiglu_ref(pairs[2 * i], pairs[2 * i + 1]);
    EXPECT_NEAR(y.item(i), want, ulps8(want)) << i;
  }
  EXPECT_EQ(y.item(0), y.item(1));  // glu 8 and 7 give the same
  EXPECT_NEAR(y.item(3), -6 * sigmoid(1.702), ulps8(6 * sigmoid(1.702)));
  EXPECT_NEAR(y.item(4), 8 * sigmoid(1.702), ulps8(8 * sigmoid(1.702)));
  EXPECT_LT(y.item(5), 0.0);
  EXPECT_GT(y.item(5), -1e-13);
  EXPECT_EQ(y.item(6), 0.0);
  EXPECT_EQ(y.item(9), 0.0);
  // Swapping glu and lin changes the result: the even column is the gate.
  const Tensor swapped = swiglu(Tensor::from_vector(Shape{2}, std::vector<double>{-8, 1}));
  EXPECT_NEAR(swapped.item(0), swiglu_ref(-8, 1), ulps8(swiglu_ref(-8, 1)));
  EXPECT_NE(swapped.item(0), y.item(3));
  // bf16 follows f32 to bf16 precision: the inputs and at most 4 ops' outputs on the path to
  // a value round to bf16 (2^-8 relative each, the sigmoid barely amplifying them): <= 0.016
  // relative, and 0.02 (1 + |y|) is above it (an absolute 0.02 near 0).
  const Tensor yb = swiglu(x.astype(DType::bf16));
  for (int i = 0; i < 10; ++i) EXPECT_NEAR(yb.item(i), y.item(i), 0.02 * (1 + std::abs(y.item(i))));
  EXPECT_THROW(swiglu(Tensor(Shape{2, 3}, DType::f32)), Error);
}

TEST(RouteTopK, SortedDescendingWithLowerIndexFirstOnTies) {
  const Tensor logits =
      Tensor::from_vector(Shape{3, 5}, std::vector<double>{1, 3, 3, 2, 3,           // ties at 3
                                                           0.1, 0.5, -1, 0.7, 0.2,  //
                                                           4, 4, 4, 4, 4});         // all equal
  const Routing r = route_top_k(logits, 3);
  EXPECT_EQ(r.experts, (std::vector<std::int64_t>{1, 2, 4, 3, 1, 4, 0, 1, 2}));
  ASSERT_EQ(r.weights.shape(), (Shape{3, 3}));
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(r.weights.item(j), 1.0 / 3, ulps8(1.0 / 3));
  // softmax of (0.7, 0.5, 0.2)
  const double z = std::exp(0.7) + std::exp(0.5) + std::exp(0.2);
  EXPECT_NEAR(r.weights.item(3), std::exp(0.7) / z, ulps8(std::exp(0.7) / z));
  EXPECT_NEAR(r.weights.item(4), std::exp(0.5) / z, ulps8(std::exp(0.5) / z));
  EXPECT_NEAR(r.weights.item(5), std::exp(0.2) / z, ulps8(std::exp(0.2) / z));
  EXPECT_EQ(route_top_k(logits, 1).experts, (std::vector<std::int64_t>{1, 3, 0}));
  EXPECT_THROW(route_top_k(logits, 0), Error);
  EXPECT_THROW(route_top_k(logits, 6), Error);
  EXPECT_THROW(route_top_k(Tensor::from_vector(Shape{1, 2}, std::vector<double>{1, NAN}), 1),
               Error);
}

// The MLP block with loops over tokens and their experts, in double.
std::vector<double> naive_mlp_block(const Tensor& x, const MlpWeights& w, std::int64_t k) {
  const std::int64_t T = x.shape()[0], H = x.shape()[1];
  const std::int64_t E = w.gate_weight.shape()[0], I = w.mlp2_weight.shape()[2];
  std::vector<double> out(static_cast<std::size_t>(T * H));
  for (std::int64_t t = 0; t < T; ++t) {
    double ms = 0;
    for (std::int64_t i = 0; i < H; ++i) ms += x.item(t * H + i) * x.item(t * H + i) / H;
    std::vector<double> n(static_cast<std::size_t>(H));
    for (std::int64_t i = 0; i < H; ++i) {
      n[i] = x.item(t * H + i) / std::sqrt(ms + 1e-5) * w.norm_scale.item(i);
    }
    std::vector<double> g(static_cast<std::size_t>(E));
    for (std::int64_t e = 0; e < E; ++e) {
      g[e] = w.gate_bias.item(e);
      for (std::int64_t i = 0; i < H; ++i) g[e] += n[i] * w.gate_weight.item(e * H + i);
    }
    std::vector<std::int64_t> order(static_cast<std::size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return g[a] > g[b]; });
    double z = 0;
    for (std::int64_t j = 0; j < k; ++j) z += std::exp(g[order[j]] - g[order[0]]);
    for (std::int64_t c = 0; c < H; ++c) out[t * H + c] = x.item(t * H + c);
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t e = order[j];
      const double weight = std::exp(g[e] - g[order[0]]) / z;
      std::vector<double> a(static_cast<std::size_t>(I));
      for (std::int64_t u = 0; u < I; ++u) {
        double h_glu = w.mlp1_bias.item(e * 2 * I + 2 * u);
        double h_lin = w.mlp1_bias.item(e * 2 * I + 2 * u + 1);
        for (std::int64_t i = 0; i < H; ++i) {
          h_glu += w.mlp1_weight.item((e * 2 * I + 2 * u) * H + i) * n[i];
          h_lin += w.mlp1_weight.item((e * 2 * I + 2 * u + 1) * H + i) * n[i];
        }
        a[u] = swiglu_ref(h_glu, h_lin);
      }
      for (std::int64_t c = 0; c < H; ++c) {
        double y = w.mlp2_bias.item(e * H + c);
        for (std::int64_t u = 0; u < I; ++u) y += w.mlp2_weight.item((e * H + c) * I + u) * a[u];
        out[t * H + c] += weight * y;
      }
    }
  }
  return out;
}

TEST(MlpBlock, MatchesNaiveLoopOverTokensAndExperts) {
  GptOssConfig c = GptOssConfig::tiny();
  for (std::int64_t k : {1, 2, 4}) {
    c.experts_per_token = k;
    // Large inputs so that some swiglu inputs reach the clamp.
    const Tensor x = random_normal(Shape{7, c.hidden_size}, DType::f64, {.seed = 14, .stream = 0});
    MlpWeights w = init_mlp_weights(c, 1, DType::f64, RandomInit{14});
    w.mlp1_bias = random_normal(w.mlp1_bias.shape(), DType::f64, {.seed = 14, .stream = 1}, 0, 6);
    const Tensor y = mlp_block(x, w, c.moe_params());
    const Tensor want = Tensor::from_vector(y.shape(), naive_mlp_block(x, w, k));
    // Per output element, the chain's sums: the norm's squares, the router's logits (and
    // bias) and their softmax over k, mlp1 and its bias, mlp2 and its bias, the weighted sum
    // over k experts and the residual.
    const ErrorModel m{.dtype = DType::f64,
                       .terms = c.hidden_size + (c.hidden_size + 1 + k) + (c.hidden_size + 1) +
                                (c.intermediate_size + 1) + (k + 1),
                       .reference = Reference::other_order};
    const Comparison cmp = compare(want, y, m);
    EXPECT_TRUE(cmp.passed) << "k " << k << ": " << cmp;
  }
}

TEST(MlpBlock, IntermediateShardsSumToTheFullExperts) {
  // Tensor parallel splits mlp1 rows (in glu/linear pairs) and mlp2 columns; the partial
  // expert outputs add up, and the mlp2 bias is added once in moe_combine.
  const GptOssConfig c = GptOssConfig::tiny();
  const MlpWeights w = init_mlp_weights(c, 0, DType::f64, RandomInit{15});
  const Tensor t = random_normal(Shape{5, c.hidden_size}, DType::f64, {.seed = 15, .stream = 0});
  const Routing r =
      route_top_k(random_normal(Shape{5, c.num_experts}, DType::f64, {.seed = 15, .stream = 1}),
                  c.experts_per_token);
  const Tensor full = moe_experts(t, r, w.mlp1_weight, w.mlp1_bias, w.mlp2_weight);
  ASSERT_EQ(full.shape(), (Shape{5, 2, c.hidden_size}));
  const std::int64_t I = c.intermediate_size;
  Tensor sum(full.shape(), DType::f64);
  for (int part = 0; part < 2; ++part) {
    const Tensor y =
        moe_experts(t, r, w.mlp1_weight.slice(1, part * I, I), w.mlp1_bias.slice(1, part * I, I),
                    w.mlp2_weight.slice(2, part * I / 2, I / 2));
    sum.vector<double>() += y.vector<double>();
  }
  // GEMMs of other sizes: mlp1 over H (and its bias), mlp2 over I (I/2 per part, then the
  // parts' sum); moe_combine adds the bias to each of the k slots and sums them weighted.
  const ErrorModel experts_model{.dtype = DType::f64,
                                 .terms = (c.hidden_size + 1) + c.intermediate_size,
                                 .reference = Reference::other_order};
  const Comparison ce = compare(full, sum, experts_model);
  EXPECT_TRUE(ce.passed) << "moe_experts: " << ce;
  const Tensor out = moe_combine(full, r, w.mlp2_bias);
  EXPECT_EQ(out.shape(), (Shape{5, c.hidden_size}));
  ErrorModel combine_model = experts_model;
  combine_model.terms += 2 * c.experts_per_token;
  const Comparison cc = compare(out, moe_combine(sum, r, w.mlp2_bias), combine_model);
  EXPECT_TRUE(cc.passed) << "moe_combine: " << cc;
}

TEST(MlpBlock, Bf16TracksF32AndConstantInitIsFinite) {
  const GptOssConfig c = GptOssConfig::tiny();
  const Tensor x = random_normal(Shape{6, c.hidden_size}, DType::f32, {.seed = 16, .stream = 0});
  const Tensor y32 =
      mlp_block(x, init_mlp_weights(c, 0, DType::f32, RandomInit{16}), c.moe_params());
  const Tensor y16 = mlp_block(x.astype(DType::bf16),
                               init_mlp_weights(c, 0, DType::bf16, RandomInit{16}), c.moe_params());
  EXPECT_EQ(y16.dtype(), DType::bf16);
  // About a dozen bf16 roundings (x, the weights, each op's output) give nmse ≈ 12 u²/3 ≈ 6e-5
  // (u = 2^-8) and 1 - pcc ≈ nmse / 2 ≈ 3e-5: 0.999 leaves 30x for amplification.
  EXPECT_GE(pcc(y32, y16), 0.999);
  const Tensor yc =
      mlp_block(x, init_mlp_weights(c, 0, DType::f32, ConstantInit{0.5}), c.moe_params());
  for (std::int64_t i = 0; i < yc.numel(); ++i) ASSERT_TRUE(std::isfinite(yc.item(i))) << i;
  // T = 0 is an empty result (an empty token shard).
  EXPECT_EQ(mlp_block(x.slice(0, 0, 0), init_mlp_weights(c, 0, DType::f32, ConstantInit{0.5}),
                      c.moe_params())
                .shape(),
            (Shape{0, c.hidden_size}));
}

TEST(MlpBlock, BadInputThrows) {
  const GptOssConfig c = GptOssConfig::tiny();
  const Tensor x(Shape{3, c.hidden_size}, DType::f32);
  MlpWeights w = init_mlp_weights(c, 0, DType::f32, ConstantInit{0.5});
  w.mlp1_weight = Tensor(Shape{4, 60, c.hidden_size}, DType::f32);
  try {
    mlp_block(x, w, c.moe_params());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mlp1_weight"), std::string::npos) << e.what();
  }
  w = init_mlp_weights(c, 0, DType::f32, ConstantInit{0.5});
  w.mlp2_bias = w.mlp2_bias.astype(DType::bf16);
  EXPECT_THROW(mlp_block(x, w, c.moe_params()), Error);
  w = init_mlp_weights(c, 0, DType::f32, ConstantInit{0.5});
  MoeParams p = c.moe_params();
  p.experts_per_token = 5;
  EXPECT_THROW(mlp_block(x, w, p), Error);
  Routing r = route_top_k(Tensor(Shape{3, 4}, DType::f32), 2);
  r.experts[0] = 4;
  EXPECT_THROW(moe_experts(x, r, w.mlp1_weight, w.mlp1_bias, w.mlp2_weight), Error);
}

}  // namespace test_ops_moe
}  // namespace meshtest
