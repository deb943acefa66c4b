// Token permutation, capacity and unpermute against naive loops and crafted routings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/ops/moe/permute.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_ops_moe_permute {

using test_support::expect_error;
using Ids = std::vector<std::int64_t>;

// A routing with given experts and weights (T = experts.size() / k).
Routing make_routing(const Ids& experts, std::int64_t k, const std::vector<double>& weights) {
  const auto t = static_cast<std::int64_t>(experts.size()) / k;
  return {.num_tokens = t,
          .k = k,
          .experts = experts,
          .weights = Tensor::from_vector(Shape{t, k}, weights)};
}

// Random routing: token t's k distinct experts drawn from [0, E), random positive weights.
Routing random_routing(std::int64_t t, std::int64_t k, std::int64_t e, std::uint64_t seed) {
  Ids ids;
  std::vector<double> w;
  for (std::int64_t i = 0; i < t; ++i) {
    Ids pool(static_cast<std::size_t>(e));
    for (std::int64_t x = 0; x < e; ++x) pool[x] = x;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t pick = integer_at({seed, 0}, i * k + j, j, e - 1);
      std::swap(pool[j], pool[pick]);
      ids.push_back(pool[j]);
      w.push_back(uniform_at({seed, 1}, i * k + j));
    }
  }
  return make_routing(ids, k, w);
}

// The reference grouping: for each expert in turn, the slots routed to it in ascending order.
void expect_grouped(const Permutation& p, const Ids& experts, std::int64_t k, std::int64_t e) {
  Ids slots, offsets{0};
  for (std::int64_t x = 0; x < e; ++x) {
    for (std::size_t s = 0; s < experts.size(); ++s) {
      if (experts[s] == x) slots.push_back(static_cast<std::int64_t>(s));
    }
    offsets.push_back(static_cast<std::int64_t>(slots.size()));
  }
  EXPECT_EQ(p.slots, slots);
  EXPECT_EQ(p.offsets, offsets);
  EXPECT_TRUE(p.dropped.empty());
  EXPECT_EQ(p.num_tokens, static_cast<std::int64_t>(experts.size()) / k);
  EXPECT_EQ(p.k, k);
  EXPECT_EQ(p.num_experts, e);
}

TEST(PermuteTop1, StableSortByExpert) {
  const Ids ids{2, 0, 2, 1, 0, 2, 4, 0};  // expert 3 gets no tokens
  const Permutation p = permute_top1(ids, 5);
  EXPECT_EQ(p.slots, (Ids{1, 4, 7, 3, 0, 2, 5, 6}));
  EXPECT_EQ(p.offsets, (Ids{0, 3, 4, 7, 7, 8}));
  EXPECT_EQ(p.count(3), 0);
  expect_grouped(p, ids, 1, 5);
  // Random ids against the loops; every token to one expert; no tokens; one token.
  Ids rnd(97);
  for (std::size_t i = 0; i < rnd.size(); ++i) rnd[i] = integer_at({3, 0}, i, 0, 6);
  expect_grouped(permute_top1(rnd, 7), rnd, 1, 7);
  const Ids same(10, 3);
  expect_grouped(permute_top1(same, 4), same, 1, 4);
  expect_grouped(permute_top1(Ids{}, 4), Ids{}, 1, 4);
  expect_grouped(permute_top1(Ids{0}, 1), Ids{0}, 1, 1);
}

TEST(PermuteTop1, ExpertOutOfRangeNamesTheToken) {
  expect_error([] { permute_top1(Ids{0, 1, 1, 7}, 4); }, {"token 3", "expert 7", "[0, 4)"});
  expect_error([] { permute_top1(Ids{0, -1}, 4); }, {"token 1", "expert -1"});
  expect_error([] { permute_top1(Ids{0}, -2); }, {"num_experts is -2"});
}

TEST(MakePermutation, TopKCopiesEveryTokenToItsExperts) {
  for (const auto [t, k, e] :
       {std::array<std::int64_t, 3>{13, 2, 5}, {9, 4, 4}, {1, 3, 8}, {0, 2, 3}, {40, 1, 6}}) {
    const Routing r = random_routing(t, k, e, static_cast<std::uint64_t>(t * 100 + k));
    const Permutation p = make_permutation(r, e);
    SCOPED_TRACE(testing::Message() << "T " << t << " k " << k << " E " << e);
    expect_grouped(p, r.experts, k, e);
    EXPECT_EQ(p.rows(), t * k);
    check_permutation(p, &r);
    if (k == e) {  // every expert holds every token, in token order
      for (std::int64_t x = 0; x < e; ++x) EXPECT_EQ(p.count(x), t);
    }
    if (k == 1) {
      const Permutation p1 = permute_top1(r.experts, e);
      EXPECT_EQ(p1.slots, p.slots);
      EXPECT_EQ(p1.offsets, p.offsets);
    }
  }
}

TEST(MakePermutation, BadRoutingThrows) {
  Routing r = make_routing({0, 1, 2, 3}, 2, {0.5, 0.5, 0.5, 0.5});
  expect_error([&] { make_permutation(r, 3); }, {"token 1", "expert 3"});
  r.experts.pop_back();
  expect_error([&] { make_permutation(r, 4); }, {"2 tokens x k 2", "lists 3 experts"});
  r = make_routing({0, 1, 2, 3}, 2, {0.5, 0.5, 0.5, 0.5});
  r.weights = Tensor(Shape{4, 1}, DType::f64);
  expect_error([&] { make_permutation(r, 4); }, {"routing.weights", "[2, 2]"});
  r.weights = Tensor();  // weights are optional
  EXPECT_EQ(make_permutation(r, 4).rows(), 4);
  r.k = 0;
  expect_error([&] { make_permutation(r, 4); }, {"k 0"});
}

TEST(ExpertCapacity, CeilOfTheFairShareTimesTheFactor) {
  EXPECT_EQ(expert_capacity(10, 2, 4, 1.0), 5);
  EXPECT_EQ(expert_capacity(10, 2, 4, 1.25), 7);  // 6.25
  EXPECT_EQ(expert_capacity(10, 2, 8, 1.0), 3);   // 2.5
  EXPECT_EQ(expert_capacity(10, 2, 4, 0.0), 0);
  EXPECT_EQ(expert_capacity(10, 2, 4, 1e300), 20);  // capped at T * k
  EXPECT_EQ(expert_capacity(0, 2, 4, 2.0), 0);
  EXPECT_EQ(expert_capacity(1, 1, 3, 1.0), 1);
  expect_error([] { expert_capacity(10, 2, 4, -0.5); }, {"capacity factor is -0.5"});
  expect_error([] { expert_capacity(10, 2, 4, NAN); }, {"capacity factor is nan"});
  expect_error([] { expert_capacity(10, 2, 4, INFINITY); }, {"capacity factor is inf"});
  expect_error([] { expert_capacity(10, 2, 0, 1.0); }, {"0 experts"});
}

// Reference drop: per expert, the slots beaten by fewer than `cap` others are kept; slot b
// beats a under TokenOrder when b < a, under LowestWeight when w[b] > w[a] or equal and b < a.
Ids reference_kept(const Routing& r, std::int64_t e, std::int64_t cap, bool by_weight) {
  Ids kept;
  const auto n = static_cast<std::int64_t>(r.experts.size());
  for (std::int64_t x = 0; x < e; ++x) {
    for (std::int64_t a = 0; a < n; ++a) {
      if (r.experts[a] != x) continue;
      std::int64_t beaten = 0;
      for (std::int64_t b = 0; b < n; ++b) {
        if (r.experts[b] != x || b == a) continue;
        const double wa = r.weights.item(a), wb = r.weights.item(b);
        beaten += by_weight ? (wb > wa || (wb == wa && b < a)) : b < a;
      }
      if (beaten < cap) kept.push_back(a);
    }
  }
  return kept;
}

Ids complement(const Ids& kept, std::int64_t n) {
  Ids out;
  for (std::int64_t s = 0; s < n; ++s) {
    if (std::find(kept.begin(), kept.end(), s) == kept.end()) out.push_back(s);
  }
  return out;
}

TEST(ApplyCapacity, BothPoliciesMatchTheReference) {
  const Routing r = random_routing(30, 2, 4, 11);
  for (const bool by_weight : {false, true}) {
    for (const std::int64_t cap : {0, 1, 7, 15, 60}) {
      SCOPED_TRACE(testing::Message() << "capacity " << cap << " by weight " << by_weight);
      Permutation p = make_permutation(r, 4);
      const std::int64_t dropped = apply_capacity(
          p, cap, by_weight ? DropPolicy::LowestWeight : DropPolicy::TokenOrder, &r.weights);
      const Ids kept = reference_kept(r, 4, cap, by_weight);
      EXPECT_EQ(p.slots, kept);
      EXPECT_EQ(p.dropped, complement(kept, 60));
      EXPECT_EQ(dropped, static_cast<std::int64_t>(p.dropped.size()));
      for (std::int64_t x = 0; x < 4; ++x) EXPECT_LE(p.count(x), cap);
      check_permutation(p, &r);
    }
  }
}

TEST(ApplyCapacity, LowestWeightTiesKeepTheLowerSlot) {
  // Expert 0 gets slots 0, 2, 3, 5 with weights 0.5, 0.9, 0.5, 0.5: capacity 2 keeps slot 3
  // (0.9) and slot 0 (the lowest of the three 0.5s).
  const Routing r = make_routing({0, 1, 0, 0, 1, 0}, 1, {0.5, 0.1, 0.9, 0.5, 0.2, 0.5});
  Permutation p = make_permutation(r, 2);
  EXPECT_EQ(apply_capacity(p, 2, DropPolicy::LowestWeight, &r.weights), 2);
  EXPECT_EQ(p.slots, (Ids{0, 2, 1, 4}));
  EXPECT_EQ(p.offsets, (Ids{0, 2, 4}));
  EXPECT_EQ(p.dropped, (Ids{3, 5}));
  // A second call drops more and keeps `dropped` ascending; TokenOrder keeps the first slots.
  EXPECT_EQ(apply_capacity(p, 1), 2);
  EXPECT_EQ(p.slots, (Ids{0, 1}));
  EXPECT_EQ(p.dropped, (Ids{2, 3, 4, 5}));
}

TEST(ApplyCapacity, BadInputThrows) {
  const Routing r = make_routing({0, 1, 0}, 1, {0.5, 0.1, NAN});
  Permutation p = make_permutation(r, 2);
  expect_error([&] { apply_capacity(p, -1); }, {"capacity is -1"});
  expect_error([&] { apply_capacity(p, 1, DropPolicy::LowestWeight); },
               {"LowestWeight needs the routing weights"});
  const Tensor bad(Shape{3, 2}, DType::f32);
  expect_error([&] { apply_capacity(p, 1, DropPolicy::LowestWeight, &bad); },
               {"weights", "[3, 1]"});
  expect_error([&] { apply_capacity(p, 1, DropPolicy::LowestWeight, &r.weights); },
               {"token 2", "NaN"});
  p.offsets[1] = 5;
  expect_error([&] { apply_capacity(p, 1); }, {"offsets decrease at expert 1"});
}

// out[t] = Σ_j w[t, j] y[row of slot t*k+j] with plain loops (the row found by search).
std::vector<double> reference_unpermute(const Tensor& y, const Permutation& p, const Tensor& w) {
  const std::int64_t h = y.shape()[1];
  std::vector<double> out(static_cast<std::size_t>(p.num_tokens * h), 0.0);
  for (std::int64_t t = 0; t < p.num_tokens; ++t) {
    for (std::int64_t j = 0; j < p.k; ++j) {
      for (std::int64_t i = 0; i < p.rows(); ++i) {
        if (p.slots[i] != t * p.k + j) continue;
        for (std::int64_t c = 0; c < h; ++c) {
          out[t * h + c] += w.item(t * p.k + j) * y.item(i * h + c);
        }
      }
    }
  }
  return out;
}

// reference_unpermute() as an f64 tensor [T, h].
Tensor reference_tensor(const Tensor& y, const Permutation& p, const Tensor& w) {
  return Tensor::from_vector(Shape{p.num_tokens, y.shape()[1]}, reference_unpermute(y, p, w));
}

TEST(PermuteUnpermute, GatherAndWeightedSumMatchLoops) {
  const std::int64_t t = 11, k = 3, e = 5, h = 6;
  const Routing r = random_routing(t, k, e, 21);
  Permutation p = make_permutation(r, e);
  apply_capacity(p, 5);  // some slots dropped (33 slots, capacity 5 of each of 5 experts)
  ASSERT_GT(p.dropped.size(), 0U);
  const Tensor x = random_normal(Shape{t, h}, DType::f64, {.seed = 21, .stream = 2});
  const Tensor xp = permute(x, p);
  ASSERT_EQ(xp.shape(), (Shape{p.rows(), h}));
  for (std::int64_t i = 0; i < p.rows(); ++i) {
    for (std::int64_t c = 0; c < h; ++c) {
      ASSERT_EQ(xp.item(i * h + c), x.item(p.slots[i] / k * h + c)) << i;
    }
  }
  const Tensor y = random_normal(Shape{p.rows(), h}, DType::f64, {.seed = 21, .stream = 3});
  const Tensor out = unpermute(y, p, r.weights);
  ASSERT_EQ(out.shape(), (Shape{t, h}));
  // At most k weighted rows per token, j ascending on both sides (FMA may fuse a product into
  // its sum on one side only); each element's sum of |terms| from the loops on |inputs|.
  const Tensor scale = reference_tensor(magnitude(y), p, magnitude(r.weights));
  const Comparison c64 = compare(
      reference_tensor(y, p, r.weights), out,
      ErrorModel{.dtype = DType::f64, .terms = k, .reference = Reference::other_order}, scale);
  EXPECT_TRUE(c64.passed) << "f64: " << c64;
  // f32 and bf16 against the loops in f64 on the same (rounded) inputs: bf16 sums in f32 and
  // rounds once.
  const Tensor y32 = y.astype(DType::f32), w32 = r.weights.astype(DType::f32);
  const Tensor out32 = unpermute(y32, p, w32);
  EXPECT_EQ(out32.dtype(), DType::f32);
  const Comparison c32 =
      compare(reference_tensor(y32, p, w32), out32,
              ErrorModel{.dtype = DType::f32, .terms = k, .reference = Reference::exact}, scale);
  EXPECT_TRUE(c32.passed) << "f32: " << c32;
  EXPECT_TRUE(permute(x.astype(DType::bf16), p).bitwise_equal(xp.astype(DType::bf16)));
  const Tensor y16 = y.astype(DType::bf16), w16 = r.weights.astype(DType::bf16);
  const Tensor out16 = unpermute(y16, p, w16);
  EXPECT_EQ(out16.dtype(), DType::bf16);
  const Comparison c16 =
      compare(reference_tensor(y16, p, w16), out16,
              ErrorModel{.dtype = DType::bf16, .terms = k, .reference = Reference::exact}, scale);
  EXPECT_TRUE(c16.passed) << "bf16: " << c16;
}

TEST(PermuteUnpermute, DroppedTokensGetZeroRowsAndEdgeSizes) {
  // Capacity 0: every slot dropped, every output row zero.
  const Routing r = random_routing(4, 2, 3, 5);
  Permutation p = make_permutation(r, 3);
  EXPECT_EQ(apply_capacity(p, expert_capacity(4, 2, 3, 0.0)), 8);
  const Tensor x = random_normal(Shape{4, 5}, DType::f32, {.seed = 5});
  EXPECT_EQ(permute(x, p).shape(), (Shape{0, 5}));
  const Tensor zero = unpermute(Tensor(Shape{0, 5}, DType::f32), p, r.weights.astype(DType::f32));
  EXPECT_TRUE(zero.bitwise_equal(Tensor(Shape{4, 5}, DType::f32)));
  // T = 0.
  const Routing none = random_routing(0, 2, 3, 5);
  const Permutation p0 = make_permutation(none, 3);
  EXPECT_EQ(permute(Tensor(Shape{0, 5}, DType::f32), p0).shape(), (Shape{0, 5}));
  EXPECT_EQ(unpermute(Tensor(Shape{0, 5}, DType::f64), p0, none.weights).shape(), (Shape{0, 5}));
  // Hidden 8192 with two tokens, k = E = 2: out = (w0 + w1) x, exactly x for weights 0.5.
  const Routing two = make_routing({1, 0, 0, 1}, 2, {0.5, 0.5, 0.5, 0.5});
  const Permutation p2 = make_permutation(two, 2);
  const Tensor big = random_normal(Shape{2, 8192}, DType::f64, {.seed = 6});
  const Tensor round_trip = unpermute(permute(big, p2), p2, two.weights);
  EXPECT_TRUE(round_trip.bitwise_equal(big));
}

TEST(PermuteUnpermute, BadShapesThrow) {
  const Routing r = random_routing(3, 2, 4, 8);
  const Permutation p = make_permutation(r, 4);
  expect_error([&] { permute(Tensor(Shape{4, 2}, DType::f64), p); }, {"permute", "3 tokens"});
  expect_error([&] { permute(Tensor(Shape{3}, DType::f64), p); }, {"x ([T, hidden])"});
  expect_error(
      [&] {
        unpermute(Tensor(Shape{5, 2}, DType::f64), p, r.weights);
      },
      {"unpermute", "keeps 6 rows"});
  expect_error(
      [&] {
        unpermute(Tensor(Shape{6, 2}, DType::f64), p, Tensor(Shape{3, 1}, DType::f64));
      },
      {"weights", "[3, 2]"});
  expect_error(
      [&] {
        unpermute(Tensor(Shape{6, 2}, DType::f32), p, r.weights);
      },
      {"weights", "f32"});
  expect_error(
      [&] {
        unpermute(Tensor(Shape{6, 2}, DType::i64), p, r.weights.astype(DType::i64));
      },
      {"dtype i64 is not supported"});
}

TEST(CheckPermutation, NamesWhatIsInconsistent) {
  const Routing r = make_routing({1, 0, 1, 2}, 2, {0.5, 0.5, 0.5, 0.5});
  const Permutation good = make_permutation(r, 3);  // slots {1, 0, 2, 3}, offsets {0,1,3,4}
  check_permutation(good, &r);
  Permutation p = good;
  p.offsets.pop_back();
  expect_error([&] { check_permutation(p); }, {"3 offsets for 3 experts, expected 4"});
  p = good;
  p.offsets[0] = 1;
  expect_error([&] { check_permutation(p); }, {"offsets run from 1 to 4"});
  p = good;
  p.offsets[1] = 3;
  p.offsets[2] = 2;
  expect_error([&] { check_permutation(p); }, {"offsets decrease at expert 1"});
  p = good;
  p.slots[3] = 0;
  expect_error([&] { check_permutation(p); }, {"slot 0 (token 0) appears twice"});
  p = good;
  p.slots[3] = 9;
  expect_error([&] { check_permutation(p); }, {"slot 9 is outside [0, 4)"});
  p = good;
  p.slots.pop_back();
  p.offsets[3] = 3;
  expect_error([&] { check_permutation(p); }, {"slot 3 is neither kept nor dropped"});
  p.dropped.push_back(3);
  check_permutation(p, &r);
  p = good;
  std::swap(p.slots[0], p.slots[1]);  // slot 0 (expert 1) now in expert 0's rows
  check_permutation(p);
  expect_error([&] { check_permutation(p, &r); },
               {"slot 0 (token 0) is in expert 0's rows but routed to expert 1"});
  Routing other = r;
  other.k = 1;
  expect_error([&] { check_permutation(good, &other); }, {"routing is for 2 tokens x k 1"});
}

}  // namespace test_ops_moe_permute
}  // namespace meshtest
