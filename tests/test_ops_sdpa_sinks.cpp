// sdpa_sinks (flash-style attention with sinks) against sdpa, the reference, and hand values.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "bench/heap_counter.hpp"
#include "src/check/metrics.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/ops/sdpa.hpp"
#include "src/ops/sdpa_sinks.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace {

using test_support::expect_error;

constexpr double kInf = std::numeric_limits<double>::infinity();

// One attention problem: sizes and the positions of query row 0 and key row 0.
struct Case {
  std::string name;
  std::int64_t tq, tk, kv_heads, q_per_kv, d;
  std::int64_t q_offset = 0;
  std::int64_t k_offset = 0;
};

struct Inputs {
  Tensor q, k, v, sinks;
};

Inputs make_inputs(const Case& c, DType dt, std::uint64_t seed) {
  return {
      random_normal(Shape{c.tq, c.kv_heads, c.q_per_kv, c.d}, dt, {.seed = seed, .stream = 0}),
      random_normal(Shape{c.tk, c.kv_heads, c.d}, dt, {.seed = seed, .stream = 1}),
      random_normal(Shape{c.tk, c.kv_heads, c.d}, dt, {.seed = seed, .stream = 2}),
      random_normal(Shape{c.kv_heads * c.q_per_kv}, dt, {.seed = seed, .stream = 3}),
  };
}

SdpaOptions options(const Case& c, std::int64_t window) {
  return {.sliding_window = window, .q_offset = c.q_offset, .k_offset = c.k_offset};
}

// The shapes of the grid: prefill, decode, Tq != Tk with offsets, one key, no key, MHA, empty
// dims, and lengths that are not multiples of the blocks.
std::vector<Case> grid_cases() {
  return {
      {"prefill 37, GQA 2x3", 37, 37, 2, 3, 8},
      {"prefill 130, 1x2, d 16", 130, 130, 1, 2, 16},
      {"decode at the end of 100 keys", 1, 100, 2, 4, 8, 99, 0},
      {"decode in the middle of 100 keys", 1, 100, 2, 4, 8, 40, 0},
      {"9 queries at 30 vs 16 keys at 18", 9, 16, 2, 2, 8, 30, 18},
      {"5 queries at 20 vs 26 keys", 5, 26, 1, 3, 4, 20, 0},
      {"one key", 5, 1, 2, 2, 8},
      {"MHA 3x1", 12, 12, 3, 1, 8},
      {"queries before every key", 4, 6, 1, 2, 8, 0, 10},
      {"no queries", 0, 9, 2, 2, 8, 3, 0},
      {"no keys", 3, 0, 2, 2, 8},
      {"no query heads", 3, 4, 2, 0, 8},
  };
}

// The error model of sdpa_sinks against sdpa (or against itself in other blocks) on `q`, `k`:
// the same terms added in another order (online softmax). n: q.k over head_dim, then the
// softmax's sum and weights.v over the keys (masked keys add zeros) and the sink.
ErrorModel sdpa_model(const Tensor& q, const Tensor& k) {
  return {.dtype = q.dtype(),
          .terms = q.shape()[3] + k.shape()[0] + 1,
          .reference = Reference::other_order};
}

// sdpa_sinks against sdpa within sdpa_model, with the tensor scale max |want| (normal inputs:
// the output is a weighted mean of zero-mean values).
void expect_within_model(const Tensor& want, const Tensor& got, const ErrorModel& m,
                         const std::string& what) {
  const Comparison c = compare(want, got, m);
  EXPECT_TRUE(c.passed) << what << ": " << c;
}

void expect_matches_sdpa(DType dt) {
  std::uint64_t seed = 100;
  for (const Case& c : grid_cases()) {
    const Inputs in = make_inputs(c, dt, ++seed);
    for (std::int64_t window : {0, 1, 3, 1000}) {
      const Tensor want = sdpa(in.q, in.k, in.v, in.sinks, options(c, window));
      for (std::int64_t block : {1, 7, 64, 1024}) {
        const Tensor got = sdpa_sinks(in.q, in.k, in.v, in.sinks, options(c, window), block);
        ASSERT_EQ(got.shape(), want.shape()) << c.name;
        ASSERT_EQ(got.dtype(), dt);
        expect_within_model(
            want, got, sdpa_model(in.q, in.k),
            fmt::format("{}, window {}, block {}, {}", c.name, window, block, dtype_name(dt)));
      }
    }
  }
}

TEST(SdpaSinks, MatchesSdpaOnTheGridInF64) { expect_matches_sdpa(DType::f64); }

TEST(SdpaSinks, MatchesSdpaOnTheGridInF32) { expect_matches_sdpa(DType::f32); }

// k ulps of `want` in f64: the tolerance of a closed form computed by a few f64 operations
// (exp, a sum, a division: no summation order a machine picks), whatever Eigen's vectorized exp
// or an FMA contraction changes by an ulp.
double f64_ulps(double want, double k) { return k * std::ldexp(std::abs(want), -52); }

TEST(SdpaSinks, HandValues) {
  // Closed forms of a few f64 operations: 8 ulps (f64_ulps).
  const auto f64 = [](Shape s, std::vector<double> v) { return Tensor::from_vector(s, v); };
  // One position: logit ln 3, sink 0 -> weight 3/4 on v = 2.
  for (std::int64_t block : {1, 64}) {
    const Tensor y = sdpa_sinks(f64({1, 1, 1, 1}, {1}), f64({1, 1, 1}, {std::log(3.0)}),
                                f64({1, 1, 1}, {2}), f64({1}, {0}), {.scale = 1.0}, block);
    EXPECT_NEAR(y.item(0), 1.5, f64_ulps(1.5, 8)) << block;
  }
  // Query at position 1 sees logits 0 and ln 2 (two key blocks at block 1).
  const Tensor k = f64({2, 1, 1}, {0, std::log(2.0)});
  const Tensor v = f64({2, 1, 1}, {4, 8});
  const Tensor q = f64({1, 1, 1, 1}, {1});
  const SdpaOptions at1{.q_offset = 1, .scale = 1.0};
  for (std::int64_t block : {1, 2}) {
    // Sink 0: weights 1/4, 2/4 -> 1 + 4 = 5. A -inf sink: weights 1/3, 2/3 -> 20/3.
    EXPECT_NEAR(sdpa_sinks(q, k, v, f64({1}, {0}), at1, block).item(0), 5.0, f64_ulps(5.0, 8));
    EXPECT_NEAR(sdpa_sinks(q, k, v, f64({1}, {-kInf}), at1, block).item(0), 20.0 / 3,
                f64_ulps(20.0 / 3, 8));
    // Window 1: only the key at position 1 -> weight 2/3 on 8 with sink 0.
    const SdpaOptions w1{.sliding_window = 1, .q_offset = 1, .scale = 1.0};
    EXPECT_NEAR(sdpa_sinks(q, k, v, f64({1}, {0}), w1, block).item(0), 16.0 / 3,
                f64_ulps(16.0 / 3, 8));
  }
}

TEST(SdpaSinks, QueryThatSeesNoKeyGetsZeros) {
  // Queries at 0..2, keys at 5..8: nothing is visible. A -inf sink gives 0 (not NaN), as sdpa;
  // a finite sink takes all the weight and also gives 0.
  const Case c{"no key visible", 3, 4, 1, 2, 4, 0, 5};
  Inputs in = make_inputs(c, DType::f64, 7);
  for (const Tensor& sinks : {Tensor::from_vector(Shape{2}, std::vector<double>{-kInf, -kInf}),
                              Tensor::from_vector(Shape{2}, std::vector<double>{-kInf, 0.5})}) {
    for (std::int64_t block : {1, 64}) {
      const Tensor y = sdpa_sinks(in.q, in.k, in.v, sinks, options(c, 0), block);
      EXPECT_EQ(max_abs_error(Tensor(y.shape(), DType::f64), y), 0.0) << block;
      EXPECT_TRUE(y.bitwise_equal(sdpa(in.q, in.k, in.v, sinks, options(c, 0))));
    }
  }
  // Mixed: query 0 sees key 0 only at window 1 past a -inf sink -> exactly v; others as sdpa.
  const Case m{"mixed", 6, 6, 2, 2, 4};
  in = make_inputs(m, DType::f64, 8);
  in.sinks = Tensor::from_vector(Shape{4}, std::vector<double>{-kInf, 0.3, -kInf, -1.0});
  const Tensor y = sdpa_sinks(in.q, in.k, in.v, in.sinks, options(m, 1), 7);
  EXPECT_EQ(y.item(0), in.v.item(0));
  expect_within_model(sdpa(in.q, in.k, in.v, in.sinks, options(m, 1)), y, sdpa_model(in.q, in.k),
                      "mixed");
}

TEST(SdpaSinks, ExplicitScaleAndTokenShards) {
  const Case c{"shards", 20, 20, 2, 2, 8};
  const Inputs in = make_inputs(c, DType::f64, 9);
  for (std::int64_t window : {0, 5}) {
    SdpaOptions o{.sliding_window = window, .scale = 0.3};
    const Tensor full = sdpa_sinks(in.q, in.k, in.v, in.sinks, o, 4);
    const std::string what = fmt::format("window {}", window);
    expect_within_model(sdpa(in.q, in.k, in.v, in.sinks, o), full, sdpa_model(in.q, in.k), what);
    // Queries 13..19 against keys 9..19: as sdpa on the same slices, and (keys 9..19 hold
    // every key that window 5 lets them see) as the full sequence's rows 13..19.
    o.q_offset = 13;
    o.k_offset = 9;
    const Tensor q = in.q.slice(0, 13, 7);
    const Tensor k = in.k.slice(0, 9, 11);
    const Tensor v = in.v.slice(0, 9, 11);
    const Tensor part = sdpa_sinks(q, k, v, in.sinks, o, 3);
    expect_within_model(sdpa(q, k, v, in.sinks, o), part, sdpa_model(q, k), what + ", part");
    if (window == 5) {  // blocks of 4 over 20 keys against blocks of 3 over 11
      expect_within_model(full.slice(0, 13, 7), part, sdpa_model(in.q, in.k),
                          what + ", part vs full");
    }
  }
}

TEST(SdpaSinks, Bf16RoundsOnlyTheOutput) {
  const Case c{"bf16", 40, 40, 2, 2, 16};
  const Inputs in = make_inputs(c, DType::bf16, 10);
  // The exact result of the bf16 inputs, in f64.
  const auto f64 = [](const Tensor& t) { return t.astype(DType::f64); };
  const Tensor exact = sdpa(f64(in.q), f64(in.k), f64(in.v), f64(in.sinks), options(c, 3));
  // sdpa's bf16 path rounds the logits, the weights and the output: further from exact.
  const double sdpa_error = max_abs_error(exact, sdpa(in.q, in.k, in.v, in.sinks, options(c, 3)));
  // One rounding of an f32 result: the model against the exact reference with r = 0 allows
  // half a bf16 ulp (2^-8 |exact|) plus the f32 sums' error (n: q.k over d, the softmax and
  // weights.v over the keys and the sink); one more bf16 rounding on the way fails it.
  const ErrorModel m{
      .dtype = DType::bf16, .terms = c.d + c.tk + 1, .roundings = 0, .reference = Reference::exact};
  for (std::int64_t block : {1, 16, 64}) {
    const Tensor got = sdpa_sinks(in.q, in.k, in.v, in.sinks, options(c, 3), block);
    ASSERT_EQ(got.dtype(), DType::bf16);
    const Comparison r = compare(exact, got, m);
    EXPECT_TRUE(r.passed) << "block " << block << ": " << r;
    EXPECT_LT(max_abs_error(exact, got), sdpa_error) << block;
  }
}

TEST(SdpaSinks, WorkingMemoryHasNoTqByTkMatrix) {
  // One head, d 8, f32, T 1024: a Tq x Tk matrix is 4 MiB; q, k, v and the output 32 KiB each.
  const Case c{"memory", 1024, 1024, 1, 1, 8};
  const Inputs in = make_inputs(c, DType::f32, 11);
  const std::int64_t matrix_bytes = 1024 * 1024 * 4;
  std::int64_t reference_peak = 0;
  std::int64_t fused_peak = 0;
  {
    const bench::HeapWindow heap;
    const Tensor y = sdpa(in.q, in.k, in.v, in.sinks, options(c, 0));
    reference_peak = heap.peak();
  }
  {
    const bench::HeapWindow heap;
    const Tensor y = sdpa_sinks(in.q, in.k, in.v, in.sinks, options(c, 0), 64);
    fused_peak = heap.peak();
  }
  // The probe sees the reference's logits; the fused op holds its output and 64 x 64 tiles.
  EXPECT_GE(reference_peak, matrix_bytes);
  EXPECT_LT(fused_peak, matrix_bytes / 16) << "sdpa peaks at " << reference_peak << " bytes";
}

TEST(SdpaSinks, BadInputNamesTheProblem) {
  const Tensor q(Shape{3, 2, 2, 4}, DType::f32);
  const Tensor k(Shape{3, 2, 4}, DType::f32);
  const Tensor s(Shape{4}, DType::f32);
  expect_error([&] { sdpa_sinks(q.reshape(Shape{3, 4, 4}), k, k, s); }, {"sdpa_sinks", "q ("});
  expect_error([&] { sdpa_sinks(q, k.reshape(Shape{3, 8}), k, s); }, {"k (", "rank 3"});
  expect_error(
      [&] {
        sdpa_sinks(q, Tensor(Shape{3, 1, 4}, DType::f32), k, s);
      },
      {"sdpa_sinks: k has shape [3, 1, 4], expected [3, 2, 4]"});
  expect_error([&] { sdpa_sinks(q, k, Tensor(Shape{2, 2, 4}, DType::f32), s); }, {"v has shape"});
  expect_error([&] { sdpa_sinks(q, k, k, Tensor(Shape{2}, DType::f32)); }, {"sinks has shape"});
  expect_error([&] { sdpa_sinks(q, k.astype(DType::f64), k, s); }, {"k has dtype f64"});
  expect_error([&] { sdpa_sinks(q, k, k, s.astype(DType::bf16)); }, {"sinks has dtype bf16"});
  expect_error(
      [&] {
        sdpa_sinks(Tensor(Shape{3, 2, 2, 0}, DType::f32), k, k, s);
      },
      {"head_dim must be > 0"});
  expect_error([&] { sdpa_sinks(q, k, k, s, {.sliding_window = -1}); }, {"sliding_window is -1"});
  expect_error([&] { sdpa_sinks(q, k, k, s, {.scale = kInf}); }, {"scale is inf"});
  expect_error([&] { sdpa_sinks(q, k, k, s, {}, 0); }, {"block is 0, expected >= 1"});
  const auto i32 = [](const Tensor& t) { return t.astype(DType::i32); };
  expect_error([&] { sdpa_sinks(i32(q), i32(k), i32(k), i32(s)); }, {"dtype i32 is not supported"});
}

}  // namespace
}  // namespace meshtest
