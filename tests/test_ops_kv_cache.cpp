// KvCache: writes at positions, range and window reads, errors; decoding through it equals sdpa.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "src/check/metrics.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/ops/kv_cache.hpp"
#include "src/ops/sdpa.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_ops_kv_cache {

using test_support::expect_error;
using Positions = std::vector<std::int64_t>;

// Rows [n, h, d] whose element (i, g, c) is base + 100 i + 10 g + c, rounded to dtype.
Tensor rows(std::int64_t n, std::int64_t h, std::int64_t d, double base, DType dtype) {
  std::vector<double> v;
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t g = 0; g < h; ++g) {
      for (std::int64_t c = 0; c < d; ++c) v.push_back(base + 100.0 * i + 10.0 * g + c);
    }
  }
  return Tensor::from_vector(Shape{n, h, d}, v).astype(dtype);
}

// Row p of a [T, h, d] tensor as doubles.
std::vector<double> row(const Tensor& t, std::int64_t p) {
  const std::int64_t w = t.shape()[1] * t.shape()[2];
  std::vector<double> out;
  for (std::int64_t c = 0; c < w; ++c) out.push_back(t.item(p * w + c));
  return out;
}

TEST(KvCache, UnwrittenPositionsReadZero) {
  const KvCache c(6, 2, 3, DType::f32);
  EXPECT_EQ(c.max_len(), 6);
  EXPECT_EQ(c.kv_heads(), 2);
  EXPECT_EQ(c.head_dim(), 3);
  EXPECT_EQ(c.dtype(), DType::f32);
  EXPECT_EQ(c.length(), 0);
  const Tensor k = c.keys(0, 6);
  EXPECT_EQ(k.shape(), (Shape{6, 2, 3}));
  EXPECT_EQ(k.dtype(), DType::f32);
  for (std::int64_t i = 0; i < k.numel(); ++i) EXPECT_EQ(k.item(i), 0.0);
  for (std::int64_t p = 0; p < 6; ++p) EXPECT_FALSE(c.written(p));
}

TEST(KvCache, WriteAtPositionsReadRangesAndOverwrite) {
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    KvCache c(8, 2, 3, dtype);
    // Positions out of order: row 0 goes to position 5, row 1 to position 1.
    c.write(rows(2, 2, 3, 1, dtype), rows(2, 2, 3, -1000, dtype), Positions{5, 1});
    EXPECT_EQ(c.length(), 6);
    const Tensor k = c.keys(0, 8), v = c.values(0, 8);
    ASSERT_EQ(k.shape(), (Shape{8, 2, 3}));
    EXPECT_EQ(k.dtype(), dtype);
    const std::vector<double> zeros(6, 0.0);
    for (std::int64_t p = 0; p < 8; ++p) {
      EXPECT_EQ(c.written(p), p == 1 || p == 5) << p;
      if (p == 5) {
        EXPECT_EQ(row(k, p), row(rows(1, 2, 3, 1, dtype), 0));
        EXPECT_EQ(row(v, p), row(rows(1, 2, 3, -1000, dtype), 0));
      } else if (p == 1) {
        EXPECT_EQ(row(k, p), row(rows(1, 2, 3, 101, dtype), 0));
        EXPECT_EQ(row(v, p), row(rows(1, 2, 3, -900, dtype), 0));
      } else {
        EXPECT_EQ(row(k, p), zeros) << p;
        EXPECT_EQ(row(v, p), zeros) << p;
      }
    }
    // A range read is the same rows.
    const Tensor mid = c.keys(1, 6);
    ASSERT_EQ(mid.shape(), (Shape{5, 2, 3}));
    for (std::int64_t p = 1; p < 6; ++p) EXPECT_EQ(row(mid, p - 1), row(k, p)) << p;
    // Overwrite position 5 (and write 7): the last write wins, others stay.
    c.write(rows(2, 2, 3, 50, dtype), rows(2, 2, 3, 60, dtype), Positions{7, 5});
    EXPECT_EQ(row(c.keys(5, 6), 0), row(rows(2, 2, 3, 50, dtype), 1));
    EXPECT_EQ(row(c.values(5, 6), 0), row(rows(2, 2, 3, 60, dtype), 1));
    EXPECT_EQ(row(c.keys(7, 8), 0), row(rows(1, 2, 3, 50, dtype), 0));
    EXPECT_EQ(row(c.keys(1, 2), 0), row(rows(1, 2, 3, 101, dtype), 0));
    EXPECT_EQ(c.length(), 8);
    // n = 0: nothing changes.
    const Tensor k_before = c.keys(0, 8), v_before = c.values(0, 8);
    c.write(Tensor(Shape{0, 2, 3}, dtype), Tensor(Shape{0, 2, 3}, dtype), Positions{});
    EXPECT_TRUE(c.keys(0, 8).bitwise_equal(k_before));
    EXPECT_TRUE(c.values(0, 8).bitwise_equal(v_before));
    EXPECT_EQ(c.length(), 8);
    // Empty ranges.
    EXPECT_EQ(c.keys(3, 3).shape(), (Shape{0, 2, 3}));
    EXPECT_EQ(c.values(8, 8).shape(), (Shape{0, 2, 3}));
  }
}

TEST(KvCache, WindowBegin) {
  const KvCache c(10, 1, 1, DType::f32);
  EXPECT_EQ(c.window_begin(5, 3), 3);  // [3, 6): three positions ending at 5
  EXPECT_EQ(c.window_begin(2, 3), 0);  // [0, 3)
  EXPECT_EQ(c.window_begin(1, 3), 0);  // shorter than the window near the start
  EXPECT_EQ(c.window_begin(0, 1), 0);
  EXPECT_EQ(c.window_begin(9, 1), 9);
  EXPECT_EQ(c.window_begin(9, 0), 0);  // no window: from position 0
  EXPECT_EQ(c.window_begin(9, 128), 0);
  EXPECT_EQ(c.window_begin(9, 10), 0);
  EXPECT_EQ(c.window_begin(9, 9), 1);
}

TEST(KvCache, BadInputThrowsAndWritesNothing) {
  expect_error([] { KvCache(0, 1, 1, DType::f32); }, {"KvCache", "max_len 0"});
  expect_error([] { KvCache(4, -1, 1, DType::f32); }, {"KvCache", "kv_heads -1"});
  expect_error([] { KvCache(4, 1, 0, DType::f32); }, {"KvCache", "head_dim 0"});
  expect_error([] { KvCache(4, 1, 1, DType::i32); }, {"KvCache", "i32"});
  KvCache c(4, 2, 3, DType::f32);
  const Tensor k1 = rows(1, 2, 3, 1, DType::f32), k2 = rows(2, 2, 3, 1, DType::f32);
  expect_error([&] { c.write(k1, k1, Positions{4}); }, {"write", "position 4", "[0, 4)"});
  expect_error([&] { c.write(k1, k1, Positions{-1}); }, {"write", "position -1"});
  // The valid first row is not written when a later one fails.
  expect_error([&] { c.write(k2, k2, Positions{0, 9}); }, {"write", "position 9", "row 1"});
  expect_error([&] { c.write(k2, k2, Positions{2, 2}); }, {"write", "position 2", "twice"});
  expect_error([&] { c.write(k2, k2, Positions{1}); }, {"write", "k", "[2, 2, 3]", "[1, 2, 3]"});
  expect_error([&] { c.write(k1, rows(1, 2, 4, 1, DType::f32), Positions{1}); },
               {"write", "v", "[1, 2, 4]"});
  expect_error([&] { c.write(rows(1, 3, 3, 1, DType::f32), k1, Positions{1}); }, {"write", "k"});
  expect_error([&] { c.write(k1.reshape(Shape{2, 3}), k1, Positions{1}); }, {"write", "k"});
  expect_error([&] { c.write(k1.astype(DType::f64), k1, Positions{1}); },
               {"write", "k", "dtype f64", "f32"});
  expect_error([&] { c.write(k1, k1.astype(DType::bf16), Positions{1}); },
               {"write", "v", "dtype bf16"});
  EXPECT_EQ(c.length(), 0);
  for (std::int64_t p = 0; p < 4; ++p) EXPECT_FALSE(c.written(p));
  expect_error([&] { (void)c.keys(3, 2); }, {"keys", "[3, 2)"});
  expect_error([&] { (void)c.values(-1, 2); }, {"values", "[-1, 2)"});
  expect_error([&] { (void)c.keys(0, 5); }, {"keys", "[0, 5)", "[0, 4]"});
  expect_error([&] { (void)c.window_begin(4, 2); }, {"window_begin", "position 4"});
  expect_error([&] { (void)c.window_begin(1, -1); }, {"window_begin", "window -1"});
  expect_error([&] { (void)c.written(4); }, {"written", "position 4"});
}

// Decoding token by token through the cache (write position p, read its window, sdpa of one
// query at offset p against keys at offset window_begin) gives the rows of one sdpa over the
// whole sequence.
TEST(KvCache, DecodingThroughTheCacheMatchesSdpaOverTheSequence) {
  const std::int64_t T = 9, kv_heads = 2, q_per_kv = 2, d = 4;
  for (const DType dtype : {DType::f64, DType::f32}) {
    for (const std::int64_t window : {0, 1, 3, 20}) {
      const Tensor q =
          random_normal(Shape{T, kv_heads, q_per_kv, d}, dtype, {.seed = 51, .stream = 0});
      const Tensor k = random_normal(Shape{T, kv_heads, d}, dtype, {.seed = 51, .stream = 1});
      const Tensor v = random_normal(Shape{T, kv_heads, d}, dtype, {.seed = 51, .stream = 2});
      const Tensor sinks =
          random_normal(Shape{kv_heads * q_per_kv}, dtype, {.seed = 51, .stream = 3});
      const Tensor full = sdpa(q, k, v, sinks, {.sliding_window = window});
      const std::int64_t width = kv_heads * q_per_kv * d;
      KvCache cache(T + 3, kv_heads, d, dtype);  // room to spare: unwritten rows are not read
      // One query row against a window of keys makes GEMMs of other sizes than the whole
      // sequence's, which may add in another order: q·k over d, the softmax over at most T
      // keys and the sink, weights·v over T keys. S: the whole output's largest value.
      const ErrorModel m{
          .dtype = dtype, .terms = d + (T + 1) + T, .reference = Reference::other_order};
      const double scale = to_f64(full).abs().maxCoeff();
      for (std::int64_t p = 0; p < T; ++p) {
        cache.write(k.slice(0, p, 1), v.slice(0, p, 1), Positions{p});
        const std::int64_t b = cache.window_begin(p, window);
        const Tensor out = sdpa(q.slice(0, p, 1), cache.keys(b, p + 1), cache.values(b, p + 1),
                                sinks, {.sliding_window = window, .q_offset = p, .k_offset = b});
        ASSERT_EQ(out.shape(), (Shape{1, width}));
        const Comparison c = compare(full.slice(0, p, 1), out, m, scale);
        EXPECT_TRUE(c.passed) << dtype_name(dtype) << " window " << window << " position " << p
                              << ": " << c;
      }
      EXPECT_EQ(cache.length(), T);
      EXPECT_FALSE(cache.written(T));
    }
  }
}

}  // namespace test_ops_kv_cache
}  // namespace meshtest
