// The MoE router, its load statistics, the token permutation (v1, v2, and a host permutation
// brought to the GPU), the grouped GEMM, the experts op and the router's RMSNorm on one GPU
// (src/gpu/moe.hpp, experts.hpp, rms_norm.hpp) against the CPU ops on the same inputs: the chosen
// experts, the counts, the permutation, the permuted rows and the unpermuted sums bit for bit;
// the weights, the probabilities, the auxiliary loss, the grouped GEMM and the experts under the
// error model (docs/tolerances.md), f32, f64 and bf16 (bf16 also against f32); the CPU tests'
// edge table (every token to one expert, an expert with none, k = 1 and k = E, ties, one token,
// none), the routing rule of the whole op (routes compared where the top-k margin exceeds the
// logits' bound; a planted flip is caught) and the bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "src/check/compare.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/experts.hpp"
#include "src/gpu/graph.hpp"
#include "src/gpu/linear.hpp"
#include "src/gpu/moe.hpp"
#include "src/gpu/rms_norm.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/moe/balance.hpp"
#include "src/ops/moe/experts.hpp"
#include "src/ops/moe/gating.hpp"
#include "src/ops/moe/grad.hpp"
#include "src/ops/moe/grouped_gemm.hpp"
#include "src/ops/moe/permute.hpp"
#include "src/ops/moe/steps.hpp"
#include "src/ops/mxfp4.hpp"
#include "src/ops/rms_norm.hpp"
#include "tests/support/expect_error.hpp"
#include "tests/support/routing_flips.hpp"

namespace meshtest::gpu {
namespace {

using test_support::expect_error;
using test_support::unexplained_flips;

constexpr DType kFloats[] = {DType::f32, DType::f64, DType::bf16};
constexpr GatingOrder kOrders[] = {GatingOrder::TopKThenSoftmax, GatingOrder::SoftmaxThenTopK};
constexpr Segments kSegments[] = {Segments::host, Segments::device};

DeviceTensor on_gpu(const Tensor& t) { return DeviceTensor::from_host(t); }

/// The default stream: every op below is followed by a copy back, which waits for it.
constexpr cudaStream_t kStream = nullptr;

Tensor logits_of(std::int64_t tokens, std::int64_t experts, DType t, std::uint64_t seed) {
  return random_normal({tokens, experts}, t, {.seed = seed, .stream = 44}, 0.0, 2.0);
}

std::string order_name(GatingOrder o) {
  return o == GatingOrder::TopKThenSoftmax ? "topk_softmax" : "softmax_topk";
}

/// Expects the GPU's routing of `logits` to have the CPU's experts bit for bit and its weights
/// within the error model: each weight is a quotient of exps summed over `terms` values (k, or
/// every expert when the softmax comes first), the CPU's in another order with another exp.
void expect_routing(const Tensor& logits, std::int64_t k, GatingOrder order,
                    const std::string& what) {
  SCOPED_TRACE(what);
  const GatingOptions o{.order = order};
  const Routing want = gate(logits, k, o);
  const Routing got = gpu::gate(DeviceTensor::from_host(logits), k, kStream, o).to_host();
  ASSERT_EQ(got.num_tokens, want.num_tokens);
  ASSERT_EQ(got.k, want.k);
  EXPECT_EQ(got.experts, want.experts);
  const std::int64_t terms = order == GatingOrder::TopKThenSoftmax ? k : logits.shape()[1] + k;
  const ErrorModel m{.dtype = logits.dtype(),
                     .terms = terms + 2,  // and the exp and the quotient of each weight
                     .roundings = logits.dtype() == DType::bf16 ? 1 : 0};
  const Comparison c = compare(want.weights, got.weights, m);
  EXPECT_TRUE(c.passed) << c;
}

TEST(GpuGate, ExpertsAreTheCpusBitsAndWeightsWithinTheModel) {
  for (const DType t : kFloats) {
    for (const GatingOrder order : kOrders) {
      for (const std::int64_t k : {1, 3, 8}) {
        expect_routing(logits_of(37, 8, t, 1), k, order,
                       fmt::format("{} {} k={} T=37 E=8", t, order_name(order), k));
      }
      expect_routing(logits_of(300, 32, t, 2), 4, order,
                     fmt::format("{} {} gpt-oss 20b router (E=32, k=4)", t, order_name(order)));
    }
  }
}

TEST(GpuGate, EdgeTable) {
  for (const DType t : kFloats) {
    for (const GatingOrder order : kOrders) {
      const std::string name = fmt::format("{} {}", t, order_name(order));
      // Every token to expert 2 (and none to 5): logit 8 there, small noise elsewhere.
      Tensor one_expert = logits_of(20, 6, DType::f64, 3);
      for (std::int64_t i = 0; i < 20; ++i) one_expert.data<double>()[i * 6 + 2] = 8.0;
      expect_routing(one_expert.astype(t), 1, order, name + " every token to one expert");
      // Ties: every logit equal (experts 0..k-1 in order), and pairs of equal logits.
      Tensor ties(Shape{5, 6}, DType::f64);
      ties.fill(0.5);
      expect_routing(ties.astype(t), 3, order, name + " all logits equal");
      Tensor pairs(Shape{4, 6}, DType::f64);
      for (std::int64_t i = 0; i < pairs.numel(); ++i) {
        pairs.data<double>()[i] = static_cast<double>((i % 6) / 2);  // 0 0 1 1 2 2
      }
      expect_routing(pairs.astype(t), 3, order, name + " pairs of equal logits");
      expect_routing(logits_of(1, 6, t, 4), 6, order, name + " one token, k = E");
      expect_routing(logits_of(0, 6, t, 5), 2, order, name + " no token");
    }
  }
}

TEST(GpuGate, Bf16TracksF32) {
  // The bf16 router on the f32 logits rounded to bf16: the same experts as the f32 router on
  // those rounded logits, and weights within bf16's model of the f32 ones.
  const Tensor rounded = logits_of(64, 16, DType::bf16, 6).astype(DType::f32);
  for (const GatingOrder order : kOrders) {
    const Routing f32 =
        gpu::gate(DeviceTensor::from_host(rounded), 4, kStream, {.order = order}).to_host();
    const Routing bf16 = gpu::gate(DeviceTensor::from_host(rounded.astype(DType::bf16)), 4, kStream,
                                   {.order = order})
                             .to_host();
    EXPECT_EQ(bf16.experts, f32.experts) << order_name(order);
    const ErrorModel m{.dtype = DType::bf16, .terms = 16 + 6, .roundings = 1};
    const Comparison c = compare(f32.weights, bf16.weights, m);
    EXPECT_TRUE(c.passed) << order_name(order) << ": " << c;
  }
}

TEST(GpuRouter, ProbabilitiesLoadAndLossAsOnTheCpu) {
  for (const DType t : kFloats) {
    SCOPED_TRACE(fmt::format("{}", t));
    const Tensor logits = logits_of(200, 16, t, 7);
    const DeviceTensor d = DeviceTensor::from_host(logits);
    const Tensor want_p = router_probabilities(logits);
    const DeviceTensor got_p = gpu::router_probabilities(d, kStream);
    ASSERT_EQ(got_p.dtype(), want_p.dtype());
    const Comparison c =
        compare(want_p, got_p.to_host(), ErrorModel{.dtype = want_p.dtype(), .terms = 16 + 2});
    EXPECT_TRUE(c.passed) << c;
    const DeviceRouting r = gpu::gate(d, 4, kStream);
    const Routing host = r.to_host();
    const Tensor load = gpu::expert_load(r, 16, kStream).to_host();
    const std::vector<std::int64_t> want_load = expert_load(host, 16);
    for (std::int64_t e = 0; e < 16; ++e) EXPECT_EQ(load.item(e), want_load[e]) << "expert " << e;
    // The loss: a mean of 200 probabilities per expert (each within the model above) weighed
    // by 16 fractions, in f64 in another order; from the CPU's probabilities, f64's model alone.
    const double want = load_balancing_loss(want_p, host);
    const double got = gpu::load_balancing_loss(got_p, r, kStream);
    const ErrorModel probs_model{.dtype = want_p.dtype(), .terms = 16 + 2 + 200 + 16};
    EXPECT_NEAR(got, want, error_bound(probs_model, want, want));
    EXPECT_NEAR(gpu::load_balancing_loss(DeviceTensor::from_host(want_p), r, kStream), want,
                error_bound({.dtype = DType::f64, .terms = 200 + 16}, want, want));
  }
}

TEST(GpuPermutation, SlotsRowsAndSumsAreTheCpusBits) {
  for (const auto& [tokens, experts, k] : std::vector<std::array<std::int64_t, 3>>{
           {37, 8, 3}, {300, 32, 4}, {1, 4, 4}, {0, 4, 2}, {700, 5, 1}}) {
    const std::string what = fmt::format("T={} E={} k={}", tokens, experts, k);
    SCOPED_TRACE(what);
    const DeviceRouting r =
        gpu::gate(DeviceTensor::from_host(logits_of(tokens, experts, DType::f32, 8)), k, kStream);
    const Routing host = r.to_host();
    const DevicePermutation dp = gpu::make_permutation(r, experts, kStream);
    const Permutation got = dp.to_host();
    const Permutation want = make_permutation(host, experts);
    EXPECT_EQ(got.slots, want.slots);
    EXPECT_EQ(got.offsets, want.offsets);
    EXPECT_TRUE(got.dropped.empty());
    for (const DType t : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::u8}) {
      const Tensor x = is_floating(t) ? random_normal({tokens, 19}, t, {.seed = 9})
                                      : random_integers({tokens, 19}, t, {.seed = 9}, 0, 100);
      EXPECT_TRUE(gpu::permute(DeviceTensor::from_host(x), dp, kStream)
                      .to_host()
                      .bitwise_equal(permute(x, want)))
          << dtype_name(t);
    }
    for (const DType t : kFloats) {
      const Tensor y = random_normal({dp.rows(), 19}, t, {.seed = 10});
      const Tensor w = host.weights.astype(t);
      const Tensor got_sum =
          gpu::unpermute(DeviceTensor::from_host(y), dp, DeviceTensor::from_host(w), kStream)
              .to_host();
      EXPECT_TRUE(got_sum.bitwise_equal(unpermute(y, want, w)))
          << dtype_name(t) << ": " << compare(unpermute(y, want, w), got_sum, Metric::exact, 0);
    }
  }
}

TEST(GpuPermutation, TopOneAndHostPermutationsAreTheCpusBits) {
  // v1: one expert per token, every expert id of 0..E-1 (expert 2 of 5 left empty).
  for (const std::int64_t tokens : {0, 1, 29, 500}) {
    SCOPED_TRACE(fmt::format("T={}", tokens));
    std::vector<std::int64_t> expert_of(static_cast<std::size_t>(tokens));
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::int64_t e = (t * 7 + t / 3) % 5;
      expert_of[static_cast<std::size_t>(t)] = e == 2 ? 4 : e;
    }
    const Permutation want = meshtest::permute_top1(expert_of, 5);
    const DevicePermutation got = gpu::permute_top1(
        DeviceTensor::from_host(Tensor::from_vector(Shape{tokens}, expert_of)), 5, kStream);
    const Permutation back = got.to_host();
    EXPECT_EQ(back.slots, want.slots);
    EXPECT_EQ(back.offsets, want.offsets);
    const Tensor x = random_normal({tokens, 7}, DType::bf16, {.seed = 31});
    EXPECT_TRUE(gpu::permute(DeviceTensor::from_host(x), got, kStream)
                    .to_host()
                    .bitwise_equal(permute(x, want)));
  }
  expect_error(
      [&] {
        (void)gpu::permute_top1(DeviceTensor::from_host(Tensor::from_vector(
                                    Shape{3}, std::vector<std::int64_t>{0, 5, 1})),
                                5, kStream);
      },
      {"gpu permute_top1: token 1 (slot 0) is routed to expert 5, expected [0, 5)"});
  expect_error([&] { (void)gpu::permute_top1(DeviceTensor(Shape{3}, DType::i32), 5, kStream); },
               {"gpu permute_top1: expert_of is", "expected i64 [T]"});
  // A host permutation with dropped slots (the capacity on the host) on the GPU: the rows and
  // sums of the CPU's.
  const Routing r = gate(logits_of(40, 6, DType::f32, 32), 2);
  Permutation host = make_permutation(r, 6);
  Tensor w = r.weights;
  meshtest::apply_capacity(host, 9, DropPolicy::LowestWeight, &w);
  ASSERT_FALSE(host.dropped.empty());
  const DevicePermutation dp = gpu::to_device(host);
  const Permutation back = dp.to_host();
  EXPECT_EQ(back.slots, host.slots);
  EXPECT_EQ(back.offsets, host.offsets);
  EXPECT_EQ(back.dropped, host.dropped);
  const Tensor y = random_normal({host.rows(), 11}, DType::f32, {.seed = 33});
  EXPECT_TRUE(gpu::unpermute(DeviceTensor::from_host(y), dp, DeviceTensor::from_host(w), kStream)
                  .to_host()
                  .bitwise_equal(unpermute(y, host, w)));
}

TEST(GpuRmsNorm, WithinTheModelOfTheCpuOpAndBf16TracksF32) {
  for (const auto& [rows, hidden] : std::vector<std::array<std::int64_t, 2>>{
           {1, 16}, {37, 2880}, {5, 700}, {0, 64}, {300, 24}}) {
    SCOPED_TRACE(fmt::format("[{}, {}]", rows, hidden));
    const Tensor x = random_normal({rows, hidden}, DType::f32, {.seed = 40}, 0.5, 3.0);
    const Tensor scale = random_normal({hidden}, DType::f32, {.seed = 41});
    const Tensor want = rms_norm(x, scale, 1e-5);
    const Tensor got =
        gpu::rms_norm(DeviceTensor::from_host(x), DeviceTensor::from_host(scale), kStream, 1e-5)
            .to_host();
    // The sum of squares over hidden, its root and the two products: f32 in another order.
    const ErrorModel m{.dtype = DType::f32, .terms = hidden + 3};
    const Comparison c = compare(want, got, m);
    EXPECT_TRUE(c.passed) << c;
    // bf16 against the f32 op on the same (bf16) values: rounded once at the end.
    const Tensor xb = x.astype(DType::bf16), sb = scale.astype(DType::bf16);
    const Tensor gb =
        gpu::rms_norm(DeviceTensor::from_host(xb), DeviceTensor::from_host(sb), kStream, 1e-5)
            .to_host();
    const Tensor wb = rms_norm(xb.astype(DType::f32), sb.astype(DType::f32), 1e-5);
    const ErrorModel mb{.dtype = DType::bf16, .terms = hidden + 3, .roundings = 1};
    const Comparison cb = compare(wb, gb, mb);
    EXPECT_TRUE(cb.passed) << cb;
  }
  const DeviceTensor x(Shape{2, 8}, DType::f32);
  expect_error([&] { (void)gpu::rms_norm(x, DeviceTensor(Shape{7}, DType::f32), kStream); },
               {"gpu rms_norm: scale is", "expected f32 or bf16 [8]"});
  expect_error([&] { (void)gpu::rms_norm(x, DeviceTensor(Shape{8}, DType::f32), kStream, -1); },
               {"gpu rms_norm: eps is -1"});
  expect_error(
      [&] {
        (void)gpu::rms_norm(DeviceTensor(Shape{2, 8}, DType::f64),
                            DeviceTensor(Shape{8}, DType::f32), kStream);
      },
      {"gpu rms_norm: x is", "f32 or bf16 expected"});
}

TEST(GpuPermutation, CapacityDropsTheCpusSlotsByEitherPolicy) {
  for (const auto& [tokens, experts, k] :
       std::vector<std::array<std::int64_t, 3>>{{64, 8, 2}, {300, 32, 4}, {50, 4, 4}, {0, 4, 2}}) {
    // Experts 0 and 1 favoured, so that they overflow; the weights also quantized to quarters,
    // so that LowestWeight meets ties.
    Tensor logits = logits_of(tokens, experts, DType::f32, 19);
    for (std::int64_t t = 0; t < tokens; ++t) {
      logits.data<float>()[t * experts] += 1.5f;
      logits.data<float>()[t * experts + 1] += 1.0f;
    }
    const DeviceRouting r = gpu::gate(DeviceTensor::from_host(logits), k, kStream);
    const Routing host = r.to_host();
    Tensor quarters = host.weights;
    for (std::int64_t i = 0; i < quarters.numel(); ++i) {
      quarters.data<float>()[i] = std::round(quarters.data<float>()[i] * 4) / 4;
    }
    for (const Tensor& w : {host.weights, quarters}) {
      const DeviceTensor dw = DeviceTensor::from_host(w);
      for (const DropPolicy policy : {DropPolicy::TokenOrder, DropPolicy::LowestWeight}) {
        for (const std::int64_t cap :
             {std::int64_t{0}, std::int64_t{1}, expert_capacity(tokens, k, experts, 1.0),
              expert_capacity(tokens, k, experts, 1.25), tokens * k}) {
          SCOPED_TRACE(
              fmt::format("T={} E={} k={} capacity {} {}", tokens, experts, k, cap,
                          policy == DropPolicy::TokenOrder ? "token order" : "lowest weight"));
          DevicePermutation dp = gpu::make_permutation(r, experts, kStream);
          Permutation cp = make_permutation(host, experts);
          EXPECT_EQ(gpu::apply_capacity(dp, cap, kStream, policy, &dw),
                    apply_capacity(cp, cap, policy, &w));
          const Permutation got = dp.to_host();
          EXPECT_EQ(got.slots, cp.slots);
          EXPECT_EQ(got.offsets, cp.offsets);
          EXPECT_EQ(got.dropped, cp.dropped);
          const Tensor y = random_normal({cp.rows(), 5}, DType::f32, {.seed = 20});
          EXPECT_TRUE(gpu::unpermute(DeviceTensor::from_host(y), dp, dw, kStream)
                          .to_host()
                          .bitwise_equal(unpermute(y, cp, w)))
              << "the dropped slots add nothing";
        }
      }
    }
  }
}

DeviceTensor offsets_on_gpu(const std::vector<std::int64_t>& offsets) {
  return DeviceTensor::from_host(
      Tensor::from_vector(Shape{static_cast<std::int64_t>(offsets.size())}, offsets));
}

TEST(GpuGroupedGemm, BothFormsMatchTheCpuOpEmptySegmentsAndEveryChunkSizeIncluded) {
  // Rows per segment: empty segments between; fewer rows than the device form's smallest chunk
  // (chunk = rows), empty segments first, between and last; one row; every row in the last
  // segment; segments of many chunks with partial last ones at chunks of 16, 64 and 128 rows
  // (a quarter of the mean segment).
  const std::vector<std::vector<std::int64_t>> cases{
      {10, 0, 21, 0, 19},       {0, 3, 0, 2, 0},  {1},         {0, 0, 40},
      {200, 0, 70, 333, 17, 1}, {600, 900, 1, 0}, {2048, 2047}};
  for (const DType t : {DType::f32, DType::bf16}) {
    for (const std::vector<std::int64_t>& counts : cases) {
      std::vector<std::int64_t> offsets{0};
      for (const std::int64_t n : counts) offsets.push_back(offsets.back() + n);
      const auto groups = static_cast<std::int64_t>(counts.size());
      const Tensor x = random_normal({offsets.back(), 24}, t, {.seed = 23});
      const Tensor w = random_normal({groups, 16, 24}, t, {.seed = 24}, 0.0, 0.2);
      const Tensor b = random_normal({groups, 16}, t, {.seed = 25});
      Blas blas;
      const DeviceTensor dx = on_gpu(x), dw = on_gpu(w), db = on_gpu(b);
      const DeviceTensor doff = offsets_on_gpu(offsets);
      for (const bool device : {false, true}) {
        SCOPED_TRACE(fmt::format("{}, rows per segment {}, offsets on the {}", t, counts,
                                 device ? "device" : "host"));
        const DeviceTensor with_bias = device ? gpu::grouped_gemm(blas, dx, doff, dw, &db)
                                              : gpu::grouped_gemm(blas, dx, offsets, dw, &db);
        const DeviceTensor no_bias = device ? gpu::grouped_gemm(blas, dx, doff, dw)
                                            : gpu::grouped_gemm(blas, dx, offsets, dw);
        blas.synchronize();
        // 24 products and the bias; bf16: the CPU rounds the product and the bias sum apart.
        const ErrorModel m{.dtype = t, .terms = 24 + 1, .roundings = t == DType::bf16 ? 2 : 0};
        const Comparison c = compare(grouped_gemm(x, offsets, w, b), with_bias.to_host(), m);
        EXPECT_TRUE(c.passed) << c;
        const Comparison c0 = compare(grouped_gemm(x, offsets, w), no_bias.to_host(), m);
        EXPECT_TRUE(c0.passed) << c0;
      }
    }
  }
}

/// An experts problem as tests/test_ops_experts.cpp makes them: weights scaled so that the
/// activations stay O(1), a wide mlp1 bias so that some swiglu inputs pass the clamp.
struct ExpertCase {
  Tensor t, gate_w, gate_b, w1, b1, w2, b2;
  MoeParams p;
  std::string label;
};

ExpertCase expert_case(std::int64_t tokens, std::int64_t e, std::int64_t k, DType d,
                       std::uint64_t seed) {
  constexpr std::int64_t hidden = 24, inter = 20;
  const auto rnd = [&](Shape s, std::uint64_t stream, double std) {
    return random_normal(std::move(s), d, {.seed = seed, .stream = stream}, 0.0, std);
  };
  const double wh = 1 / std::sqrt(double{hidden}), wi = 1 / std::sqrt(double{inter});
  return {rnd({tokens, hidden}, 0, 1),
          rnd({e, hidden}, 1, wh),
          rnd({e}, 2, 0.5),
          rnd({e, 2 * inter, hidden}, 3, 2 * wh),
          rnd({e, 2 * inter}, 4, 4),
          rnd({e, hidden, inter}, 5, wi),
          rnd({e, hidden}, 6, 0.5),
          MoeParams{.experts_per_token = k},
          fmt::format("{} T={} E={} k={}", d, tokens, e, k)};
}

/// The CPU experts test's model: the router over hidden and its bias and softmax over E, mlp1
/// over hidden and its bias, mlp2 over I and its bias, the weighted sum over k; bf16 rounds 11
/// stages' outputs.
ErrorModel experts_model(const ExpertCase& c) {
  const std::int64_t hidden = c.t.shape()[1], e = c.gate_w.shape()[0];
  const std::int64_t inter = c.w2.shape()[2];
  return {.dtype = c.t.dtype(),
          .terms = (hidden + 1 + e) + (hidden + 1) + (inter + 1) + c.p.experts_per_token,
          .roundings = c.t.dtype() == DType::bf16 ? 11 : 0};
}

/// The GPU routing of the CPU's choice.
DeviceRouting routing_on_gpu(const Routing& r) {
  Tensor ids(Shape{r.num_tokens, r.k}, DType::i64);
  for (std::size_t i = 0; i < r.experts.size(); ++i) ids.data<std::int64_t>()[i] = r.experts[i];
  return {
      .num_tokens = r.num_tokens, .k = r.k, .experts = on_gpu(ids), .weights = on_gpu(r.weights)};
}

TEST(GpuExperts, FromTheCpusRoutingWithinTheModel) {
  for (const Segments segments : kSegments) {
    for (const DType d : {DType::f32, DType::bf16}) {
      for (const auto& [tokens, e, k] : std::vector<std::array<std::int64_t, 3>>{
               {1, 4, 2}, {37, 8, 2}, {37, 4, 4}, {20, 6, 1}, {128, 32, 4}, {0, 4, 2}}) {
        const ExpertCase c = expert_case(tokens, e, k, d, 16);
        SCOPED_TRACE(fmt::format("{}, segments on the {}", c.label,
                                 segments == Segments::host ? "host" : "device"));
        const Routing r = route_top_k(linear(c.t, c.gate_w, c.gate_b), k);
        Blas blas;
        const DeviceTensor got =
            experts_routed(blas, on_gpu(c.t), routing_on_gpu(r), on_gpu(c.w1), on_gpu(c.b1),
                           on_gpu(c.w2), on_gpu(c.b2), c.p, segments);
        blas.synchronize();
        const Tensor want = experts(c.t, c.gate_w, c.gate_b, c.w1, c.b1, c.w2, c.b2, c.p);
        const Comparison cmp = compare(want, got.to_host(), experts_model(c));
        EXPECT_TRUE(cmp.passed) << cmp;
      }
    }
  }
}

TEST(GpuExperts, CapturedWithDeviceSegmentsAReplayIsTheEagerOpOnNewTokens) {
  for (const DType d : {DType::f32, DType::bf16}) {
    const ExpertCase c = expert_case(64, 8, 2, d, 21);
    SCOPED_TRACE(c.label);
    Blas blas;
    DeviceTensor t = on_gpu(c.t);
    const DeviceTensor gw = on_gpu(c.gate_w), gb = on_gpu(c.gate_b), w1 = on_gpu(c.w1),
                       b1 = on_gpu(c.b1), w2 = on_gpu(c.w2), b2 = on_gpu(c.b2);
    const auto run = [&] {
      return gpu::experts(blas, t, gw, gb, w1, b1, w2, b2, c.p, Segments::device);
    };
    Graph g;
    DeviceTensor y;
    g.capture([&] { y = run(); });
    ASSERT_TRUE(g.captured());
    Tensor before;
    for (int round = 0; round < 3; ++round) {
      // New tokens in t's buffer: the graph routes them itself (a replay of the captured
      // routing would give other experts than the eager call on them).
      t.assign_slice(0, 0, on_gpu(random_normal({64, 24}, d, {.seed = 40U + round})));
      g.replay();
      g.synchronize();
      const Tensor replayed = y.to_host();
      const DeviceTensor eager = run();
      blas.synchronize();
      EXPECT_TRUE(eager.to_host().bitwise_equal(replayed)) << "round " << round;
      EXPECT_FALSE(replayed.bitwise_equal(before)) << "round " << round << " repeats the last";
      before = replayed;
    }
    Graph host_segments;
    expect_error(
        [&] {
          host_segments.capture(
              [&] { (void)gpu::experts(blas, t, gw, gb, w1, b1, w2, b2, c.p, Segments::host); });
        },
        {"gpu experts: Segments::host reads the experts' row counts back",
         "capture with Segments::device"});
  }
}

TEST(GpuExperts, Bf16AgainstTheF32CpuOpOnTheSameValues) {
  // The bf16 experts from a routing against the CPU's f32 experts on the same (bf16) values and
  // routing: every stage rounds to bf16 on the GPU (mlp1, swiglu's five steps, mlp2, the
  // weighted sum), the f32 op once at the end of none.
  for (const auto& [tokens, e, k] :
       std::vector<std::array<std::int64_t, 3>>{{37, 8, 2}, {128, 32, 4}, {20, 6, 1}}) {
    const ExpertCase c = expert_case(tokens, e, k, DType::bf16, 19);
    SCOPED_TRACE(c.label);
    const Routing r = route_top_k(linear(c.t, c.gate_w, c.gate_b), k);
    Blas blas;
    const DeviceTensor got = experts_routed(blas, on_gpu(c.t), routing_on_gpu(r), on_gpu(c.w1),
                                            on_gpu(c.b1), on_gpu(c.w2), on_gpu(c.b2), c.p);
    blas.synchronize();
    const auto f32 = [](const Tensor& x) { return x.astype(DType::f32); };
    Routing r32 = r;
    r32.weights = f32(r.weights);
    const Tensor want = moe_combine(
        moe_experts(f32(c.t), r32, f32(c.w1), f32(c.b1), f32(c.w2), c.p), r32, f32(c.b2));
    const std::int64_t hidden = c.t.shape()[1], inter = c.w2.shape()[2];
    const ErrorModel m{
        .dtype = DType::bf16, .terms = (hidden + 1) + (inter + 1) + k, .roundings = 8};
    const Comparison cmp = compare(want, got.to_host(), m);
    EXPECT_TRUE(cmp.passed) << cmp;
  }
}

TEST(GpuExperts, TheWholeOpRoutesAsTheCpuWhereTheMarginExceedsTheLogitsBound) {
  for (const DType d : {DType::f32, DType::bf16}) {
    const ExpertCase c = expert_case(300, 32, 4, d, 17);  // gpt-oss's E = 32, top-4
    SCOPED_TRACE(c.label);
    Blas blas;
    const DeviceTensor dt = on_gpu(c.t), gw = on_gpu(c.gate_w), gb = on_gpu(c.gate_b);
    const DeviceTensor logits = gpu::linear(blas, dt, gw, gb);
    const DeviceTensor got =
        gpu::experts(blas, dt, gw, gb, on_gpu(c.w1), on_gpu(c.b1), on_gpu(c.w2), on_gpu(c.b2), c.p);
    blas.synchronize();
    const Tensor cpu_logits = linear(c.t, c.gate_w, c.gate_b);
    // The router's GEMM: 24 products and the bias, in another order than the CPU's.
    const ErrorModel lm{.dtype = d, .terms = 24 + 1, .roundings = d == DType::bf16 ? 1 : 0};
    const Comparison lc = compare(cpu_logits, logits.to_host(), lm);
    ASSERT_TRUE(lc.passed) << lc;
    double scale = 0;
    for (std::int64_t i = 0; i < cpu_logits.numel(); ++i) {
      scale = std::max(scale, std::abs(cpu_logits.item(i)));
    }
    const double bound = 2 * error_bound(lm, scale, scale);
    const Routing cpu = route_top_k(cpu_logits, 4);
    const Routing gpu_r = gpu::gate(logits, 4, nullptr).to_host();
    EXPECT_TRUE(unexplained_flips(cpu_logits, cpu, gpu_r, bound).empty());
    // The rule catches a flip it cannot explain: the 4th and 5th experts of the token with the
    // widest gap between them swapped.
    std::int64_t widest = 0, fifth_of_widest = 0;
    double widest_gap = -1;
    for (std::int64_t t = 0; t < 300; ++t) {
      std::int64_t fifth = -1;  // the best expert not among the token's four
      for (std::int64_t j = 0; j < 32; ++j) {
        const auto mine = cpu.experts.begin() + t * 4;
        if (std::find(mine, mine + 4, j) != mine + 4) continue;
        if (fifth < 0 || cpu_logits.item(t * 32 + j) > cpu_logits.item(t * 32 + fifth)) fifth = j;
      }
      const double gap =
          cpu_logits.item(t * 32 + cpu.experts[t * 4 + 3]) - cpu_logits.item(t * 32 + fifth);
      if (gap > widest_gap) {
        widest = t;
        fifth_of_widest = fifth;
        widest_gap = gap;
      }
    }
    ASSERT_GT(widest_gap, bound) << "no token's top-4 stands clear of the 5th";
    Routing planted = cpu;
    planted.experts[widest * 4 + 3] = fifth_of_widest;
    EXPECT_EQ(unexplained_flips(cpu_logits, cpu, planted, bound),
              std::vector<std::int64_t>{widest});
    // Where the routes agree, the whole op is the CPU's within the model; a token the rule
    // excuses (a near-tie the GPU's GEMM tipped) is left out of the comparison, and counted.
    const Tensor want = experts(c.t, c.gate_w, c.gate_b, c.w1, c.b1, c.w2, c.b2, c.p);
    Tensor same = got.to_host();
    std::int64_t flipped = 0;
    for (const std::int64_t t : test_support::flipped_tokens(cpu, gpu_r)) {
      ++flipped;
      same.assign_slice(0, t, want.slice(0, t, 1));
    }
    EXPECT_LE(flipped, 3) << "more near-ties than 300 tokens of random logits should hold";
    const Comparison cmp = compare(want, same, experts_model(c));
    EXPECT_TRUE(cmp.passed) << cmp << " (" << flipped << " excused tokens)";
  }
}

TEST(GpuMoeBackward, GradientsWithinTheModelOfTheCpuOp) {
  for (const auto& [tokens, e, k] : std::vector<std::array<std::int64_t, 3>>{
           {37, 8, 2}, {64, 4, 4}, {20, 6, 1}, {128, 32, 4}, {3, 8, 2}}) {
    const ExpertCase c = expert_case(tokens, e, k, DType::f32, 23);
    SCOPED_TRACE(c.label);
    const Routing r = route_top_k(linear(c.t, c.gate_w, c.gate_b), k);
    const Tensor grad_out = random_normal({tokens, 24}, DType::f32, {.seed = 24});
    const MoeGrads want = moe_backward(c.t, r, c.w1, c.b1, c.w2, c.b2, grad_out, c.p);
    Blas blas;
    const DeviceMoeGrads got =
        gpu::moe_backward(blas, on_gpu(c.t), routing_on_gpu(r), on_gpu(c.w1), on_gpu(c.b1),
                          on_gpu(c.w2), on_gpu(c.b2), on_gpu(grad_out), c.p);
    blas.synchronize();
    // The forward again (hidden and the bias, then I), the chain back through mlp2 (hidden),
    // swiglu and mlp1 (2I), the sums over a segment's rows (at most T k) and a token's k slots.
    constexpr std::int64_t hidden = 24, inter = 20;
    const ErrorModel m{.dtype = DType::f32,
                       .terms = (hidden + 1) + inter + hidden + 2 * inter + tokens * k + k + 8};
    for (const auto& [name, w, g] : {std::tuple{"t", &want.t, &got.t},
                                     {"weights", &want.weights, &got.weights},
                                     {"mlp1_weight", &want.mlp1_weight, &got.mlp1_weight},
                                     {"mlp1_bias", &want.mlp1_bias, &got.mlp1_bias},
                                     {"mlp2_weight", &want.mlp2_weight, &got.mlp2_weight},
                                     {"mlp2_bias", &want.mlp2_bias, &got.mlp2_bias}}) {
      const Comparison cmp = compare(*w, g->to_host(), m);
      EXPECT_TRUE(cmp.passed) << name << ": " << cmp;
    }
  }
  // bf16 is the CPU op's Error too (f32 only).
  const ExpertCase c = expert_case(4, 4, 2, DType::bf16, 25);
  Blas blas;
  const Routing r = route_top_k(linear(c.t, c.gate_w, c.gate_b), 2);
  expect_error(
      [&] {
        (void)gpu::moe_backward(blas, on_gpu(c.t), routing_on_gpu(r), on_gpu(c.w1), on_gpu(c.b1),
                                on_gpu(c.w2), on_gpu(c.b2), on_gpu(c.t), c.p);
      },
      {"gpu moe_backward: t is bf16[4, 24]", "f32 expected"});
}

TEST(GpuMxfp4, DecodeIsTheCpusBitsInEveryFloatType) {
  // Random bytes: every code of both nibbles; every scale 0..255 (past f16's and f32's range
  // at both ends: zeros, subnormals and Inf as the host rounds them).
  const Tensor blocks = random_integers({3, 256, 16}, DType::u8, {.seed = 21}, 0, 255);
  Tensor scales(Shape{3, 256}, DType::u8);
  for (std::int64_t i = 0; i < scales.numel(); ++i) {
    scales.data<std::uint8_t>()[i] = static_cast<std::uint8_t>((i * 7) % 256);
  }
  const DeviceTensor db = DeviceTensor::from_host(blocks), ds = DeviceTensor::from_host(scales);
  for (const DType out : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
    const Tensor got = gpu::mxfp4_decode(db, ds, out, kStream).to_host();
    const Tensor want = mxfp4_decode(blocks, scales, out);
    EXPECT_TRUE(got.bitwise_equal(want))
        << dtype_name(out) << ": " << compare(want, got, Metric::exact, 0);
  }
  expect_error([&] { (void)gpu::mxfp4_decode(db, ds, DType::i32, kStream); },
               {"gpu mxfp4_decode: output dtype i32 is not bf16, f16, f32 or f64"});
  expect_error(
      [&] {
        (void)gpu::mxfp4_decode(DeviceTensor(Shape{3, 4, 8}, DType::u8), ds, DType::f32, kStream);
      },
      {"gpu mxfp4_decode"});
}

TEST(GpuMxfp4, ExpertsOnWeightsDecodedOnTheGpu) {
  // The checkpoint's MXFP4 experts decoded on the GPU feed the experts op as the CPU-decoded
  // weights feed the CPU's (hidden and I multiples of 32, as the format needs).
  for (const DType d : {DType::f32, DType::bf16}) {
    ExpertCase c = expert_case(40, 4, 2, d, 22);
    const auto rnd = [&](Shape s, std::uint64_t stream, double std) {
      return random_normal(std::move(s), d, {.seed = 22, .stream = stream}, 0.0, std);
    };
    c.t = rnd({40, 32}, 0, 1);
    c.gate_w = rnd({4, 32}, 1, 0.2);
    const Mxfp4 w1 = mxfp4_encode(rnd({4, 64, 32}, 3, 0.35));
    const Mxfp4 w2 = mxfp4_encode(rnd({4, 32, 32}, 5, 0.2));
    c.w1 = mxfp4_decode(w1, d);
    c.w2 = mxfp4_decode(w2, d);
    c.b1 = rnd({4, 64}, 4, 4);
    c.b2 = rnd({4, 32}, 6, 0.5);
    const DeviceTensor gw1 = gpu::mxfp4_decode(on_gpu(w1.blocks), on_gpu(w1.scales), d, kStream);
    const DeviceTensor gw2 = gpu::mxfp4_decode(on_gpu(w2.blocks), on_gpu(w2.scales), d, kStream);
    ASSERT_TRUE(gw1.to_host().bitwise_equal(c.w1));
    ASSERT_TRUE(gw2.to_host().bitwise_equal(c.w2));
    const Routing r = route_top_k(linear(c.t, c.gate_w, c.gate_b), 2);
    Blas blas;
    const DeviceTensor got = experts_routed(blas, on_gpu(c.t), routing_on_gpu(r), gw1, on_gpu(c.b1),
                                            gw2, on_gpu(c.b2), c.p);
    blas.synchronize();
    const Tensor want = experts(c.t, c.gate_w, c.gate_b, c.w1, c.b1, c.w2, c.b2, c.p);
    const Comparison cmp = compare(want, got.to_host(), experts_model(c));
    EXPECT_TRUE(cmp.passed) << dtype_name(d) << ": " << cmp;
  }
}

TEST(GpuMoe, BadInputIsAnErrorNamingIt) {
  const DeviceTensor logits = DeviceTensor::from_host(logits_of(4, 6, DType::f32, 11));
  expect_error([&] { (void)gpu::gate(logits, 0, kStream); }, {"gpu gate: k is 0, expected 1 .. 6"});
  expect_error([&] { (void)gpu::gate(logits, 7, kStream); }, {"k is 7, expected 1 .. 6"});
  expect_error([&] { (void)gpu::gate(DeviceTensor(Shape{6}, DType::f32), 1, kStream); },
               {"gpu gate: logits are", "expected [T, experts]"});
  expect_error(
      [&] {
        (void)gpu::gate(DeviceTensor(Shape{2, 6}, DType::i32), 1, kStream);
      },
      {"gpu gate: logits are", "f32, f64 or bf16 expected"});
  Tensor nan = logits_of(4, 6, DType::f32, 12);
  nan.data<float>()[2 * 6 + 5] = std::numeric_limits<float>::quiet_NaN();
  nan.data<float>()[3 * 6 + 1] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { (void)gpu::gate(DeviceTensor::from_host(nan), 2, kStream); },
               {"gpu gate: logit of token 2, expert 5 is NaN"});
  expect_error([&] { (void)gpu::router_probabilities(DeviceTensor::from_host(nan), kStream); },
               {"gpu router_probabilities: logit of token 2, expert 5 is NaN"});
  // A routing with an expert id out of range (as a bad dispatch would deliver).
  DeviceRouting bad = gpu::gate(logits, 2, kStream);
  Tensor ids = bad.experts.to_host();
  ids.data<std::int64_t>()[5] = 9;
  bad.experts = DeviceTensor::from_host(ids);
  expect_error([&] { (void)gpu::make_permutation(bad, 6, kStream); },
               {"gpu make_permutation: token 2 (slot 1) is routed to expert 9, expected [0, 6)"});
  expect_error([&] { (void)gpu::expert_load(bad, 0, kStream); },
               {"gpu expert_load: 0 experts, expected at least 1"});
  const DevicePermutation p = gpu::make_permutation(gpu::gate(logits, 2, kStream), 6, kStream);
  expect_error(
      [&] {
        (void)gpu::permute(DeviceTensor(Shape{5, 3}, DType::f32), p, kStream);
      },
      {"gpu permute: x is", "the permutation is for 4 tokens"});
  const DeviceTensor y(Shape{8, 3}, DType::f32);
  expect_error(
      [&] {
        (void)gpu::unpermute(y, p, DeviceTensor(Shape{4, 3}, DType::f32), kStream);
      },
      {"gpu unpermute: weights are", "expected f32[4, 2]"});
  expect_error(
      [&] {
        (void)gpu::unpermute(y, p, DeviceTensor(Shape{4, 2}, DType::f64), kStream);
      },
      {"gpu unpermute: weights are"});
  DevicePermutation q = gpu::make_permutation(gpu::gate(logits, 2, kStream), 6, kStream);
  expect_error([&] { (void)gpu::apply_capacity(q, -1, kStream); },
               {"gpu apply_capacity: capacity is -1, expected >= 0"});
  expect_error([&] { (void)gpu::apply_capacity(q, 1, kStream, DropPolicy::LowestWeight); },
               {"DropPolicy::LowestWeight needs the routing weights [4, 2]"});
  Tensor nan_w(Shape{4, 2}, DType::f32);
  nan_w.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  const DeviceTensor dnan = DeviceTensor::from_host(nan_w);
  expect_error([&] { (void)gpu::apply_capacity(q, 1, kStream, DropPolicy::LowestWeight, &dnan); },
               {"gpu apply_capacity: weight of token 2, slot 1 is NaN"});
  Blas blas;
  const DeviceTensor x(Shape{10, 4}, DType::f32), w(Shape{3, 5, 4}, DType::f32);
  const std::vector<std::int64_t> bad_end{0, 4, 4, 9}, bad_order{0, 6, 4, 10}, few{0, 10};
  expect_error([&] { (void)gpu::grouped_gemm(blas, x, bad_end, w); },
               {"gpu grouped_gemm: offsets run from 0 to 9, expected 0 to 10"});
  expect_error([&] { (void)gpu::grouped_gemm(blas, x, bad_order, w); },
               {"offsets[1] = 6 > offsets[2] = 4"});
  expect_error([&] { (void)gpu::grouped_gemm(blas, x, few, w); }, {"2 offsets for 3 groups"});
  // The same offsets on the device: clamped there, named after the stream.
  expect_error([&] { (void)gpu::grouped_gemm(blas, x, offsets_on_gpu(bad_end), w); },
               {"gpu grouped_gemm: the offsets on the device do not run from 0 to 10",
                "the first bad one is offsets[3]"});
  expect_error([&] { (void)gpu::grouped_gemm(blas, x, offsets_on_gpu(bad_order), w); },
               {"the first bad one is offsets[2]"});
  expect_error(
      [&] {
        (void)gpu::grouped_gemm(blas, x, offsets_on_gpu({1, 4, 4, 10}), w);
      },
      {"the first bad one is offsets[0]"});
  expect_error([&] { (void)gpu::grouped_gemm(blas, x, offsets_on_gpu(few), w); },
               {"gpu grouped_gemm: offsets are", "expected i64 [4] (w's groups + 1)"});
  expect_error(
      [&] {
        (void)gpu::grouped_gemm(blas, x, bad_end, DeviceTensor(Shape{3, 5, 3}, DType::f32));
      },
      {"gpu grouped_gemm: w is", "expected [G, out, 4]"});
  const ExpertCase c = expert_case(5, 4, 2, DType::f32, 18);
  expect_error(
      [&] {
        (void)gpu::experts(blas, on_gpu(c.t), on_gpu(c.gate_w), on_gpu(c.gate_b), on_gpu(c.w1),
                           on_gpu(c.b1), on_gpu(c.w2.astype(DType::bf16)), on_gpu(c.b2), c.p);
      },
      {"gpu experts: mlp2_weight is", "expected dtype f32"});
  expect_error(
      [&] {
        (void)gpu::experts(blas, on_gpu(c.t), on_gpu(c.gate_w), on_gpu(c.gate_b), on_gpu(c.w1),
                           on_gpu(c.b1), on_gpu(c.w2), on_gpu(c.b2), {.experts_per_token = 5});
      },
      {"k is 5, expected 1 .. 4"});
}

}  // namespace
}  // namespace meshtest::gpu
