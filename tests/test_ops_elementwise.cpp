// add_bias and embedding_shard against naive loops and exact sums.
#include <gtest/gtest.h>

#include <vector>

#include "src/core/random.hpp"
#include "src/ops/elementwise.hpp"
#include "src/ops/embedding.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_ops_elementwise {

using test_support::expect_error;

TEST(AddBias, MatchesANaiveLoopInEveryDtype) {
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    const Tensor x = random_normal(Shape{2, 3, 5}, dtype, {.seed = 1});
    const Tensor b = random_normal(Shape{5}, dtype, {.seed = 2});
    const Tensor y = add_bias(x, b);
    ASSERT_EQ(y.shape(), x.shape());
    ASSERT_EQ(y.dtype(), dtype);
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      // One rounding of the exact (f64) sum to the dtype: bf16 adds in f32 and rounds once.
      const double want =
          Tensor::from_vector<double>(Shape{1}, {x.item(i) + b.item(i % 5)}).astype(dtype).item(0);
      EXPECT_EQ(y.item(i), want) << dtype_name(dtype) << " element " << i;
    }
  }
}

TEST(AddBias, BadShapesAndDtypesAreNamed) {
  const Tensor x(Shape{2, 4}, DType::f32);
  expect_error([&] { add_bias(x, Tensor(Shape{3}, DType::f32)); }, {"add_bias", "bias", "[4]"});
  expect_error([&] { add_bias(x, Tensor(Shape{4}, DType::f64)); }, {"add_bias", "bias", "f32"});
  expect_error(
      [&] {
        add_bias(Tensor(Shape{2, 4}, DType::i32), Tensor(Shape{4}, DType::i32));
      },
      {"add_bias", "i32"});
}

TEST(EmbeddingShard, ShardsSumToTheWholeLookupExactly) {
  const Tensor table = random_normal(Shape{10, 3}, DType::bf16, {.seed = 3});
  const std::vector<std::int64_t> tokens{9, 0, 4, 4, 7, 2};
  const Tensor whole = embedding(tokens, table);
  for (const int parts : {1, 3, 4}) {
    Tensor sum(whole.shape(), DType::f64);
    for (int i = 0; i < parts; ++i) {
      const Range r = split_range(10, parts, i);
      const Tensor y = embedding_shard(tokens, table.slice(0, r), r.start, 10);
      for (std::int64_t t = 0; t < y.shape()[0]; ++t) {
        const bool inside = tokens[t] >= r.start && tokens[t] < r.start + r.size;
        for (std::int64_t j = 0; j < 3; ++j) {
          if (!inside) {
            EXPECT_EQ(y.item(t * 3 + j), 0.0) << "token " << t << " part " << i;
          }
          sum.span<double>()[t * 3 + j] += y.item(t * 3 + j);
        }
      }
    }
    EXPECT_TRUE(sum.astype(DType::bf16).bitwise_equal(whole)) << parts << " parts";
  }
}

TEST(EmbeddingShard, BadIdsAndShardsAreNamed) {
  const Tensor shard(Shape{4, 2}, DType::f32);
  expect_error(
      [&] {
        embedding_shard(std::vector<std::int64_t>{1, 12}, shard, 4, 12);
      },
      {"token 12 at position 1", "[0, 12)"});
  expect_error([&] { embedding_shard(std::vector<std::int64_t>{1}, shard, 10, 12); },
               {"shard rows [10, 14)", "[0, 12)"});
  EXPECT_EQ(embedding_shard({}, shard, 0, 12).shape(), (Shape{0, 2}));
}

}  // namespace test_ops_elementwise
}  // namespace meshtest
