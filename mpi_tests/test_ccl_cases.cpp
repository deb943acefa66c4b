// The table of collective cases (dist/ccl/cases.hpp) on its own, locally: its closed-form
// expected outputs against references built from every device's materialized input, bf16 and
// f16 sums exact at any group size, the rows' names and bus factors, and bad calls.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "dist/ccl/cases.hpp"
#include "dist/ccl/ccl.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {
namespace {

/// Groups of p devices: ids 0..p-1, and axis 0 of a mesh with 4 columns (ids 3, 7, 11, ...).
std::vector<std::vector<int>> groups() {
  std::vector<std::vector<int>> out;
  for (int p : {1, 2, 3, 5, 17, 33}) {
    std::vector<int> g(static_cast<std::size_t>(p));
    std::iota(g.begin(), g.end(), 0);
    out.push_back(g);
    for (int& d : g) d = 3 + 4 * d;
    out.push_back(g);
  }
  return out;
}

std::vector<Tensor> inputs(const CclCall& c) {
  std::vector<Tensor> xs;
  for (int j = 0; j < c.p(); ++j) xs.push_back(ccl_case(c.op).input(c, j));
  return xs;
}

/// Element-wise reduction in f64 of the materialized inputs, rounded as every path rounds.
Tensor reduce_ref(const std::vector<Tensor>& xs, ReduceOp op) {
  Tensor acc = xs.front().astype(DType::f64);
  auto a = acc.vector<double>();
  for (std::size_t k = 1; k < xs.size(); ++k) {
    const Tensor b = xs[k].astype(DType::f64);
    if (op == ReduceOp::max) {
      a = a.cwiseMax(b.vector<double>());
    } else if (op == ReduceOp::min) {
      a = a.cwiseMin(b.vector<double>());
    } else {
      a += b.vector<double>();
    }
  }
  if (op == ReduceOp::avg) a /= static_cast<double>(xs.size());
  const DType t = xs.front().dtype();
  return widens_to_f32(t) ? acc.astype(DType::f32).astype(t) : acc.astype(t);
}

void expect_expected(const CclCall& c, int i, const Tensor& want) {
  const Tensor got = ccl_case(c.op).expected(c, i);
  EXPECT_TRUE(got.bitwise_equal(want)) << describe(got) << " vs " << describe(want);
  EXPECT_EQ(count_wrong(got, want), 0);
}

TEST(CclCases, ReductionsEqualTheInputsReduced) {
  const Shape base{2, 3, 2};
  for (const std::vector<int>& g : groups()) {
    const int p = static_cast<int>(g.size());
    for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
      for (ReduceOp r : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg}) {
        if (r == ReduceOp::avg && !is_floating(t)) continue;
        SCOPED_TRACE(fmt::format("p {} from device {}, {} {}", p, g[0], t, reduce_op_name(r)));
        const CclCall ar{.op = CclOp::all_reduce,
                         .dtype = t,
                         .reduce = r,
                         .devices = g,
                         .shape = Shape{2, p + 1, 3}};
        const Tensor full = reduce_ref(inputs(ar), r);
        expect_expected(ar, p - 1, full);
        const CclCall rs{.op = CclOp::reduce_scatter,
                         .dtype = t,
                         .reduce = r,
                         .devices = g,
                         .shape = base.with(1, p + 1),
                         .dim = 1};
        for (int i : {0, p - 1}) {
          expect_expected(rs, i, reduce_ref(inputs(rs), r).slice(1, split_range(p + 1, p, i)));
        }
      }
    }
  }
}

TEST(CclCases, RearrangementsEqualTheInputsRearranged) {
  const Shape base{2, 3, 2};
  for (const std::vector<int>& g : groups()) {
    const int p = static_cast<int>(g.size());
    for (DType t : {DType::bf16, DType::u8}) {
      SCOPED_TRACE(fmt::format("p {} from device {}, {}", p, g[0], t));
      CclCall ag{.op = CclOp::all_gather, .dtype = t, .devices = g, .shape = base, .dim = -1};
      for (int i = 0; i < p; ++i) ag.sizes.push_back(i % 3);
      expect_expected(ag, 0, concat(inputs(ag), -1));
      CclCall v{.op = CclOp::all_to_all_v,
                .dtype = t,
                .devices = g,
                .shape = base,
                .dim = 1,
                .concat_dim = 1};
      for (int i = 0; i < p * p; ++i) v.counts.push_back((i / p + 2 * (i % p)) % 3);
      const std::vector<Tensor> xs = inputs(v);
      for (int i : {0, p - 1}) {
        std::vector<Tensor> pieces;
        for (int j = 0; j < p; ++j) {
          std::int64_t at = 0;
          for (int k = 0; k < i; ++k) at += v.counts[static_cast<std::size_t>(j * p + k)];
          pieces.push_back(xs[static_cast<std::size_t>(j)].slice(
              1, at, v.counts[static_cast<std::size_t>(j * p + i)]));
        }
        expect_expected(v, i, concat(pieces, 1));
      }
      const CclCall a{.op = CclOp::all_to_all,
                      .dtype = t,
                      .devices = g,
                      .shape = base.with(0, 2 * p),
                      .dim = 0,
                      .concat_dim = 2};
      std::vector<Tensor> pieces;
      for (const Tensor& x : inputs(a)) pieces.push_back(split(x, p, 0)[0]);
      expect_expected(a, 0, concat(pieces, 2));
      const CclCall b{
          .op = CclOp::broadcast, .dtype = t, .devices = g, .shape = Shape{5}, .root = p - 1};
      expect_expected(b, 0, inputs(b).back());
    }
  }
}

// 17 consecutive devices of an axis whose stride 17 does not divide cancel: the sum over a whole
// group stays within +-36 and is exact in bf16 and f16 at any p.
TEST(CclCases, SumsAreExactInBf16AndF16AtAnyGroupSize) {
  for (int stride : {1, 2, 3, 8, 16, 18}) {
    for (int p = 1; p <= 200; ++p) {
      std::vector<int> g;
      for (int k = 0; k < p; ++k) g.push_back(1 + k * stride);
      CclCall c{.op = CclOp::all_reduce, .dtype = DType::f64, .devices = g, .shape = Shape{17}};
      const Tensor exact = ccl_case(c.op).expected(c, 0);
      for (DType t : {DType::bf16, DType::f16}) {
        c.dtype = t;
        const Tensor narrow = ccl_case(c.op).expected(c, 0);
        for (std::int64_t k = 0; k < 17; ++k) {
          ASSERT_EQ(narrow.item(k), exact.item(k))
              << dtype_name(t) << ", stride " << stride << ", p " << p << ", k " << k;
          ASSERT_LE(std::abs(exact.item(k)), 36) << "stride " << stride << ", p " << p;
        }
      }
    }
  }
}

TEST(CclCases, RowsNameTheirCclAndItsBusFactor) {
  const auto rows = ccl_cases();
  ASSERT_EQ(rows.size(), 6u);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(static_cast<std::size_t>(rows[i].op), i);
    EXPECT_EQ(&ccl_case(rows[i].op), &rows[i]);
  }
  EXPECT_EQ(ccl_case(CclOp::all_reduce).name, "all_reduce");
  EXPECT_EQ(ccl_case(CclOp::all_to_all_v).name, "all_to_all_v");
  EXPECT_EQ(ccl_case(CclOp::reduce_scatter).mpi_name, "MPI_Reduce_scatter_block");
  EXPECT_EQ(ccl_case(CclOp::all_reduce).bus_factor, &all_reduce_bw::bus_factor);
  EXPECT_EQ(ccl_case(CclOp::all_gather).bus_factor, &all_gather_bw::bus_factor);
  EXPECT_EQ(ccl_case(CclOp::reduce_scatter).bus_factor, &reduce_scatter_bw::bus_factor);
  EXPECT_EQ(ccl_case(CclOp::all_to_all).bus_factor, &all_to_all_bw::bus_factor);
  EXPECT_EQ(ccl_case(CclOp::all_to_all_v).bus_factor, &all_to_all_bw::bus_factor);
  EXPECT_EQ(ccl_case(CclOp::broadcast).bus_factor, &broadcast_bw::bus_factor);
  EXPECT_EQ(ccl_case(CclOp::all_reduce).ring_passes, 2);
}

TEST(CclCases, BadCallsThrow) {
  const std::vector<int> g{0, 1, 2};
  const CclCall sizes{.op = CclOp::all_gather, .devices = g, .shape = Shape{4}, .sizes = {1, 2}};
  EXPECT_THROW(ccl_case(sizes.op).input(sizes, 0), Error);
  const CclCall counts{.op = CclOp::all_to_all_v, .devices = g, .shape = Shape{4}, .counts = {1}};
  EXPECT_THROW(ccl_case(counts.op).expected(counts, 0), Error);
  const CclCall root{.op = CclOp::broadcast, .devices = g, .shape = Shape{4}, .root = 3};
  EXPECT_THROW(ccl_case(root.op).expected(root, 0), Error);
  const CclCall u8{.op = CclOp::all_reduce, .dtype = DType::u8, .devices = g, .shape = Shape{4}};
  EXPECT_THROW(ccl_case(u8.op).expected(u8, 0), Error);
  const CclCall avg{.op = CclOp::all_reduce,
                    .dtype = DType::i32,
                    .reduce = ReduceOp::avg,
                    .devices = g,
                    .shape = Shape{4}};
  EXPECT_THROW(ccl_case(avg.op).expected(avg, 0), Error);
  const CclCall outside{.op = CclOp::all_reduce, .devices = g, .shape = Shape{4}};
  EXPECT_THROW(ccl_case(outside.op).input(outside, 3), Error);
}

}  // namespace
}  // namespace meshtest::dist
