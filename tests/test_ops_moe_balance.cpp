// Load-balancing loss, expert load and expert placements against loops and crafted cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/ops/moe/balance.hpp"
#include "src/ops/moe/gating.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_ops_moe_balance {

using test_support::expect_error;
using Ids = std::vector<std::int64_t>;

Routing routing_of(const Ids& experts, std::int64_t k) {
  const auto t = static_cast<std::int64_t>(experts.size()) / k;
  return {.num_tokens = t, .k = k, .experts = experts, .weights = Tensor(Shape{t, k}, DType::f32)};
}

// E · Σ_e f_e P_e with plain loops over slots and tokens.
double reference_loss(const Tensor& probs, const Routing& r) {
  const std::int64_t t_count = probs.shape()[0], e_count = probs.shape()[1];
  double loss = 0;
  for (std::int64_t e = 0; e < e_count; ++e) {
    double f = 0, p = 0;
    for (const std::int64_t x : r.experts)
      f += x == e ? 1.0 / static_cast<double>(t_count * r.k) : 0;
    for (std::int64_t t = 0; t < t_count; ++t) p += probs.item(t * e_count + e) / t_count;
    loss += f * p;
  }
  return static_cast<double>(e_count) * loss;
}

TEST(LoadBalancingLoss, MatchesLoopsAndItsBounds) {
  const std::int64_t t_count = 23, e_count = 8;
  for (const std::int64_t k : {1, 2, 8}) {
    // In f64 for every probs dtype: the loops add up to T·k slot fractions per expert, both
    // sides T probabilities per expert, then E products. The terms are positive, so the sum
    // of |terms| is the loss itself.
    const ErrorModel m{.dtype = DType::f64,
                       .terms = t_count * k + t_count + e_count,
                       .reference = Reference::other_order};
    const Tensor logits = random_normal(Shape{t_count, e_count}, DType::f64, {.seed = 41}, 0, 2);
    const Tensor probs = router_probabilities(logits);
    const Routing r = gate(logits, k);
    const double want = reference_loss(probs, r);
    EXPECT_NEAR(load_balancing_loss(probs, r), want, error_bound(m, want, want)) << "k " << k;
    // f32 probabilities are read exactly: the loops on the same f32 values.
    const Tensor probs32 = probs.astype(DType::f32);
    const double want32 = reference_loss(probs32, r);
    EXPECT_NEAR(load_balancing_loss(probs32, r), want32, error_bound(m, want32, want32))
        << "f32, k " << k;
  }
  // Uniform routing and probabilities: 1 exactly. Every token to expert 0 with probability 1: E.
  const Tensor uniform = Tensor::from_vector(Shape{4, 4}, std::vector<double>(16, 0.25));
  EXPECT_EQ(load_balancing_loss(uniform, routing_of({2, 0, 3, 1}, 1)), 1.0);
  std::vector<double> one_hot(16, 0.0);
  for (int t = 0; t < 4; ++t) one_hot[t * 4] = 1.0;
  EXPECT_EQ(
      load_balancing_loss(Tensor::from_vector(Shape{4, 4}, one_hot), routing_of({0, 0, 0, 0}, 1)),
      4.0);
  // k = E: every f_e = 1/E, so the loss is Σ P_e = 1 for any probabilities. Against the closed
  // form: each row's softmax (E terms), the mean over T tokens and the sum over E experts.
  const Tensor p = router_probabilities(random_normal(Shape{3, 4}, DType::f64, {.seed = 42}));
  const std::int64_t pt = p.shape()[0], pe = p.shape()[1];
  const ErrorModel one{.dtype = DType::f64, .terms = pe + pt + pe, .reference = Reference::exact};
  EXPECT_NEAR(load_balancing_loss(p, routing_of({0, 1, 2, 3, 3, 2, 1, 0, 1, 0, 3, 2}, 4)), 1.0,
              error_bound(one, 1.0, 1.0));
  // No tokens: 0; one token.
  EXPECT_EQ(load_balancing_loss(Tensor(Shape{0, 4}, DType::f32), routing_of({}, 2)), 0.0);
  // 3 · (1 · 0.3) with a few exact terms (0 · p) added: 1e-15 is 9 ulps of 0.9.
  const Tensor one_token = Tensor::from_vector(Shape{1, 3}, std::vector<double>{0.5, 0.3, 0.2});
  EXPECT_NEAR(load_balancing_loss(one_token, routing_of({1}, 1)), 3 * 0.3, 1e-15);
}

TEST(LoadBalancingLoss, BadInputThrows) {
  const Tensor probs(Shape{3, 4}, DType::f32);
  expect_error([&] { load_balancing_loss(probs, routing_of({0, 1}, 1)); }, {"probs", "[2, 4]"});
  expect_error(
      [&] {
        load_balancing_loss(probs, routing_of({0, 1, 4}, 1));
      },
      {"token 2", "expert 4", "[0, 4)"});
  Routing r = routing_of({0, 1, 2}, 1);
  r.experts.push_back(0);
  expect_error([&] { load_balancing_loss(probs, r); }, {"3 tokens x k 1", "lists 4 experts"});
  expect_error([&] { load_balancing_loss(Tensor(Shape{12}, DType::f32), routing_of({0}, 1)); },
               {"probs ([T, E])"});
  expect_error(
      [&] {
        load_balancing_loss(Tensor(Shape{3, 4}, DType::i64), routing_of({0, 1, 2}, 1));
      },
      {"dtype i64"});
}

TEST(ExpertLoad, CountsSlotsPerExpert) {
  EXPECT_EQ(expert_load(routing_of({3, 0, 3, 3, 1, 3}, 2), 5), (Ids{1, 1, 0, 4, 0}));
  EXPECT_EQ(expert_load(routing_of({}, 3), 2), (Ids{0, 0}));
  EXPECT_EQ(expert_load(routing_of({1, 1, 1}, 1), 2), (Ids{0, 3}));
  expect_error([] { expert_load(routing_of({0, 2}, 1), 2); }, {"token 1", "expert 2"});
  expect_error([] { expert_load(routing_of({0}, 1), 0); }, {"num_experts is 0"});
}

// Devices' experts in the closed form of array_split: device d holds E/D + (d < E % D).
TEST(ContiguousPlacement, ArraySplitBlocks) {
  for (const auto& [e, d] :
       {std::pair<std::int64_t, int>{10, 4}, {8, 8}, {3, 5}, {1, 1}, {7, 1}, {32, 3}}) {
    SCOPED_TRACE(testing::Message() << "E " << e << " D " << d);
    const ExpertPlacement p = contiguous_placement(e, d);
    check_placement(p);
    EXPECT_EQ(p.num_experts, e);
    EXPECT_EQ(p.num_devices, d);
    std::int64_t next = 0;
    for (int dev = 0; dev < d; ++dev) {
      const std::int64_t n = e / d + (dev < e % d ? 1 : 0);
      Ids want(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) want[i] = next + i;
      EXPECT_EQ(p.experts_of[dev], want) << "device " << dev;
      for (std::int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(p.device_of[next + i], dev);
        EXPECT_EQ(p.local_index(next + i), i);
      }
      next += n;
    }
  }
  EXPECT_TRUE(contiguous_placement(3, 5).experts_of[4].empty());  // E < D: devices with none
  expect_error([] { contiguous_placement(0, 2); }, {"0 experts on 2 devices"});
  expect_error([] { contiguous_placement(4, 0); }, {"4 experts on 0 devices"});
}

// Greedy LPT written as scans: the heaviest unplaced expert (lower id on ties) to the device of
// least (load, experts, id).
std::vector<int> reference_lpt(const Ids& load, int devices) {
  const auto n = static_cast<std::int64_t>(load.size());
  std::vector<int> device_of(static_cast<std::size_t>(n), -1);
  std::vector<std::int64_t> dl(static_cast<std::size_t>(devices), 0), dc(dl);
  for (std::int64_t step = 0; step < n; ++step) {
    std::int64_t e = -1;
    for (std::int64_t x = 0; x < n; ++x) {
      if (device_of[x] < 0 && (e < 0 || load[x] > load[e])) e = x;
    }
    int best = 0;
    for (int d = 0; d < devices; ++d) {
      if (std::pair(dl[d], dc[d]) < std::pair(dl[best], dc[best])) best = d;
    }
    device_of[e] = best;
    dl[best] += load[e];
    ++dc[best];
  }
  return device_of;
}

TEST(BalancedPlacement, GreedyLongestFirst) {
  // Crafted: 10 -> d0, 7 -> d1, 6 -> d2, 5 -> d2, 4 -> d1, 3 -> d0, then 1 to d1 (d1 and d2 tie
  // at load 11 with 2 experts each: the lower device).
  const Ids load{10, 7, 6, 5, 4, 3, 1};
  const ExpertPlacement p = balanced_placement(load, 3);
  check_placement(p);
  EXPECT_EQ(p.experts_of, (std::vector<Ids>{{0, 5}, {1, 4, 6}, {2, 3}}));
  EXPECT_EQ(device_load(p, load), (Ids{13, 12, 11}));
  EXPECT_EQ(p.local_index(6), 2);
  // Equal loads: ties by lower expert, then fewer experts: round robin.
  EXPECT_EQ(balanced_placement(Ids(5, 0), 2).experts_of, (std::vector<Ids>{{0, 2, 4}, {1, 3}}));
  // E < D: the last devices hold none.
  const ExpertPlacement few = balanced_placement(Ids{3, 9}, 4);
  EXPECT_EQ(few.experts_of, (std::vector<Ids>{{1}, {0}, {}, {}}));
  // Random skewed loads against the scans; never worse than the contiguous blocks here.
  for (const int d : {1, 2, 3, 5, 8}) {
    Ids rnd(19);
    for (std::size_t e = 0; e < rnd.size(); ++e) {
      rnd[e] = integer_at({43, 0}, e, 0, 100) * (e < 3 ? 20 : 1);  // three hot experts
    }
    const ExpertPlacement b = balanced_placement(rnd, d);
    check_placement(b);
    EXPECT_EQ(b.device_of, reference_lpt(rnd, d)) << "D " << d;
    const Ids lb = device_load(b, rnd), lc = device_load(contiguous_placement(19, d), rnd);
    EXPECT_LE(*std::max_element(lb.begin(), lb.end()), *std::max_element(lc.begin(), lc.end()));
  }
}

TEST(BalancedPlacement, BadInputThrows) {
  expect_error([] { balanced_placement(Ids{}, 2); }, {"lists no experts"});
  expect_error([] { balanced_placement(Ids{1, -3}, 2); }, {"expert 1 has load -3"});
  expect_error([] { balanced_placement(Ids{1, 2}, 0); }, {"0 devices"});
}

TEST(CheckPlacement, NamesTheExpertMissingOrTwice) {
  const ExpertPlacement good = contiguous_placement(5, 2);  // {0, 1, 2}, {3, 4}
  ExpertPlacement p = good;
  p.experts_of[1].pop_back();
  expect_error([&] { check_placement(p); }, {"expert 4 is on no device"});
  p = good;
  p.experts_of[1].push_back(1);
  expect_error([&] { check_placement(p); }, {"expert 1 is placed twice (devices 0 and 1)"});
  p = good;
  p.device_of[2] = 1;
  expect_error([&] { check_placement(p); },
               {"device_of says expert 2 is on device 1, experts_of says device 0"});
  p = good;
  p.experts_of[0].push_back(7);
  expect_error([&] { check_placement(p); }, {"device 0 holds expert 7"});
  p = good;
  p.experts_of.pop_back();
  expect_error([&] { check_placement(p); }, {"experts_of 1 devices"});
  p = good;
  p.num_devices = 0;
  expect_error([&] { check_placement(p); }, {"5 experts on 0 devices"});
  expect_error([&] { (void)good.local_index(5); }, {"expert 5 is outside [0, 5)"});
  expect_error([&] { device_load(good, Ids{1, 2}); }, {"lists 2 experts, the placement 5"});
}

}  // namespace test_ops_moe_balance
}  // namespace meshtest
