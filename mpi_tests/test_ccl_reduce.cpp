// The reduction rule of every CCL path (dist/ccl/reduce.hpp): the p terms combined in axis
// order, bf16 and f16 accumulated in f32 and rounded once, the same bits on the shared-memory
// and the MPI path; the kernel itself against a scalar loop (stages, aliasing, every dtype); and
// the shared-memory path's traffic, checked against its closed form.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dist/ccl/ccl.hpp"
#include "dist/ccl/paths/shm/shm.hpp"
#include "dist/ccl/reduce.hpp"
#include "src/core/random.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {
namespace {

using detail::ShmGroup;

/// Device j's term: random bf16, f16 (or f32) values of spread-out magnitudes, so that rounding
/// after every addition and rounding once give different bits on many elements.
Tensor term(const Shape& shape, DType t, int j) {
  const Tensor x =
      random_normal(shape, DType::f32, {.seed = 11, .stream = static_cast<std::uint64_t>(j)});
  const auto s = x.span<float>();
  std::vector<float> v(s.begin(), s.end());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] *= static_cast<float>(1 << (i % 9));
  return Tensor::from_vector(shape, v).astype(t);
}

/// The reference: a plain loop over the devices' terms in axis order, accumulating in f32,
/// dividing for avg, then rounding to t once.
Tensor reference(const Shape& shape, DType t, int p, ReduceOp op) {
  std::vector<float> acc(static_cast<std::size_t>(shape.numel()), 0.0F);
  for (int j = 0; j < p; ++j) {
    const Tensor x = term(shape, t, j).astype(DType::f32);
    const auto v = x.span<float>();
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = j == 0 ? v[i] : acc[i] + v[i];
  }
  if (op == ReduceOp::avg) {
    for (float& a : acc) a /= static_cast<float>(p);
  }
  return Tensor::from_vector(shape, acc).astype(t);
}

/// A line mesh whose communicators take the shared-memory path (shm) or the MPI path.
MeshDevice line_on(bool shm) {
  ShmGroup::set_enabled(shm);
  MeshDevice mesh = MeshDevice::line();
  Tensor one(Shape{1}, DType::i32);
  (void)all_reduce(mesh, one);  // the first agreed call makes the group (or not)
  ShmGroup::set_enabled(true);
  return mesh;
}

class CclReduce : public ::testing::TestWithParam<bool> {};

TEST_P(CclReduce, TwoByteFloatsAccumulateInF32AndRoundOnce) {
  const MeshDevice mesh = line_on(GetParam());
  const int p = mesh.size(), me = mesh.device_id();
  // big: the first power of two whose ulp is 2 (bf16 256, f16 2048).
  for (const auto& [t, big] : {std::pair{DType::bf16, 256}, std::pair{DType::f16, 2048}}) {
    SCOPED_TRACE(fmt::format("{}", t));
    // Device 0 holds big, every other device 1: rounding after each addition keeps big for ever
    // (big + 1 rounds to even); rounding once gives big + p - 1 rounded once (exact for odd p).
    Tensor x(Shape{2 * p + 3}, t);
    x.fill(me == 0 ? big : 1.0);
    const double once =
        Tensor::from_vector<float>(Shape{1}, {static_cast<float>(big + p - 1)}).astype(t).item(0);
    if (p >= 3) {
      EXPECT_NE(once, big);
    }
    EXPECT_EQ(all_reduce(mesh, x).item(0), once);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      SCOPED_TRACE(reduce_op_name(op));
      const Shape shape{p * 37, 5};
      const Tensor want = reference(shape, t, p, op);
      const Tensor got = all_reduce(mesh, term(shape, t, me), {.op = op});
      EXPECT_TRUE(got.bitwise_equal(want)) << "all_reduce";
      Tensor inplace = term(shape, t, me);
      all_reduce_inplace(mesh, inplace, {.op = op});
      EXPECT_TRUE(inplace.bitwise_equal(want)) << "all_reduce_inplace";
      for (int dim : {0, 1}) {
        const Shape s = dim == 0 ? shape : Shape{5, p * 37};
        const Tensor full = reference(s, t, p, op);
        const Tensor rs = reduce_scatter(mesh, term(s, t, me), {.dim = dim, .op = op});
        EXPECT_TRUE(rs.bitwise_equal(full.slice(dim, me * 37, 37))) << "reduce_scatter dim " << dim;
      }
    }
  }
}

TEST_P(CclReduce, F16RoundsOnceBelowItsUlpAndAtItsEdges) {
  // Crafted f16 sums whose one rounding differs from a rounding after each addition: device 0
  // holds the first value, every other device half its ulp (the least subnormal for 2^-13), so
  // each step's tie rounds back to the even first value while the exact sum moves past it; and
  // 65504 plus terms of 8 that reach the tie to Inf (65520) only together.
  const MeshDevice mesh = line_on(GetParam());
  const int p = mesh.size(), me = mesh.device_id();
  const std::vector<double> first = {1.0, 0x1p-13, 65504.0, -2048.0};
  const std::vector<double> other = {0x1p-11, 0x1p-24, 8.0, -1.0};
  const Tensor x = Tensor::from_vector(Shape{4}, me == 0 ? first : other).astype(DType::f16);
  std::vector<float> acc(first.begin(), first.end());
  for (int j = 1; j < p; ++j) {
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += static_cast<float>(other[i]);
  }
  const Tensor want = Tensor::from_vector(Shape{4}, acc).astype(DType::f16);
  const Tensor got = all_reduce(mesh, x);
  EXPECT_TRUE(got.bitwise_equal(want));
  if (p >= 3) {  // each step's rounding would keep 1, 2^-13, 65504 and -2048
    EXPECT_GT(got.item(0), 1.0);
    EXPECT_GT(got.item(1), 0x1p-13);
    EXPECT_EQ(got.item(2), INFINITY);
    EXPECT_LT(got.item(3), -2048.0);
  }
}

TEST_P(CclReduce, FloatSumsAddInAxisOrderOnEveryDevice) {
  const MeshDevice mesh = line_on(GetParam());
  const int p = mesh.size(), me = mesh.device_id();
  // Several shared-memory chunks with a ragged tail: every element reduced in axis order.
  const Shape shape{(std::int64_t{3} << 17) / 4 + 5};
  const Tensor want = reference(shape, DType::f32, p, ReduceOp::sum);
  EXPECT_TRUE(all_reduce(mesh, term(shape, DType::f32, me)).bitwise_equal(want));
  const Shape blocks{p * 4099};
  EXPECT_TRUE(reduce_scatter(mesh, term(blocks, DType::f32, me))
                  .bitwise_equal(
                      reference(blocks, DType::f32, p, ReduceOp::sum).slice(0, me * 4099, 4099)));
}

INSTANTIATE_TEST_SUITE_P(Path, CclReduce, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "SharedMemory" : "Mpi"; });

/// Sums over the devices of what `call` moved: steps, bytes written and bytes read.
struct Moved {
  std::int64_t steps = 0, written = 0, read = 0;
};
template <class Call>
Moved moved_by(const ShmGroup& g, const Call& call) {
  const ShmGroup::Traffic before = g.traffic();
  call();
  const ShmGroup::Traffic after = g.traffic();
  std::array<std::int64_t, 3> v{static_cast<std::int64_t>(after.steps - before.steps),
                                static_cast<std::int64_t>(after.written - before.written),
                                static_cast<std::int64_t>(after.read - before.read)};
  MPI_Allreduce(MPI_IN_PLACE, v.data(), 3, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return {v[0], v[1], v[2]};
}

/// detail::reduce and reduce_stage against a scalar loop over the terms in axis order (T stored,
/// A accumulated), with the terms in tiles and side by side: sums and averages of 1-17 terms of
/// mixed magnitudes (so another order gives other bits), lengths around the kernels' blocks, in
/// two stages with a carry, and with the destination one of the terms.
template <class T, class A>
void expect_sums_in_axis_order(DType t) {
  for (const std::size_t p : {1UL, 2UL, 3UL, 8UL, 17UL}) {
    for (const std::int64_t n : {0L, 1L, 31L, 32L, 33L, 64L, 1000L, 4101L}) {
      std::vector<std::vector<T>> v(p, std::vector<T>(static_cast<std::size_t>(n)));
      std::vector<const std::byte*> terms;
      for (std::size_t j = 0; j < p; ++j) {
        for (std::int64_t k = 0; k < n; ++k) {
          const std::uint64_t h = (j * 1000003 + static_cast<std::uint64_t>(k)) * 2654435761U;
          if constexpr (std::is_integral_v<T>) {
            v[j][static_cast<std::size_t>(k)] = static_cast<T>(h);  // sums wrap
          } else {
            const double x = static_cast<double>(h % 2001) - 1000.0;
            v[j][static_cast<std::size_t>(k)] =
                static_cast<T>(std::ldexp(x, static_cast<int>((h >> 20) % 25) - 12));
          }
        }
        terms.push_back(reinterpret_cast<const std::byte*>(v[j].data()));
      }
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        if (op == ReduceOp::avg && std::is_integral_v<T>) continue;
        SCOPED_TRACE(fmt::format("{} {} of {} terms, {} elements", t, reduce_op_name(op), p, n));
        std::vector<T> want(static_cast<std::size_t>(n)), got(want.size());
        for (std::size_t k = 0; k < want.size(); ++k) {
          A acc = static_cast<A>(v[0][k]);
          for (std::size_t j = 1; j < p; ++j) acc += static_cast<A>(v[j][k]);
          if constexpr (std::is_floating_point_v<A>) {
            if (op == ReduceOp::avg) acc /= static_cast<A>(p);
          }
          want[k] = static_cast<T>(acc);
        }
        // Both kernels: tiles (as for a call that reads little) and side by side.
        for (const std::size_t footprint : {std::size_t{1}, ~std::size_t{0}}) {
          SCOPED_TRACE(footprint == 1 ? "tiles" : "side by side");
          const auto bytes = [](std::vector<T>& x) {
            return reinterpret_cast<std::byte*>(x.data());
          };
          const auto same = [&](std::vector<T>& x) {
            return want.empty() || std::memcmp(x.data(), want.data(), want.size() * sizeof(T)) == 0;
          };
          std::fill(got.begin(), got.end(), T{});
          detail::reduce(bytes(got), terms, n, t, op, footprint);
          EXPECT_TRUE(same(got)) << "reduce";
          // Two stages: the first (p+1)/2 terms' accumulator carried into the rest.
          const std::size_t half = (p + 1) / 2;
          std::vector<A> carry(want.size());
          const auto total = static_cast<std::int64_t>(p);
          std::fill(got.begin(), got.end(), T{});
          detail::reduce_stage(reinterpret_cast<std::byte*>(carry.data()),
                               std::span(terms).first(half), n, t, op,
                               {.carry = nullptr, .last = false, .total = total}, footprint);
          detail::reduce_stage(bytes(got), std::span(terms).subspan(half), n, t, op,
                               {.carry = reinterpret_cast<const std::byte*>(carry.data()),
                                .last = true,
                                .total = total},
                               footprint);
          EXPECT_TRUE(same(got)) << "two stages";
          // In place: the last term is the destination.
          std::vector<T> last = v[p - 1];
          std::vector<const std::byte*> aliased = terms;
          aliased[p - 1] = bytes(last);
          detail::reduce(bytes(last), aliased, n, t, op, footprint);
          EXPECT_TRUE(same(last)) << "into a term";
        }
      }
    }
  }
}

TEST(CclReduceKernel, SumsEqualAScalarLoopInAxisOrder) {
  expect_sums_in_axis_order<float, float>(DType::f32);
  expect_sums_in_axis_order<double, double>(DType::f64);
  expect_sums_in_axis_order<bf16, float>(DType::bf16);
  expect_sums_in_axis_order<f16, float>(DType::f16);
  expect_sums_in_axis_order<std::uint32_t, std::uint32_t>(DType::i32);
  expect_sums_in_axis_order<std::uint64_t, std::uint64_t>(DType::i64);
}

TEST(CclShmTraffic, EveryCclMovesTheBandwidthMinimum) {
  const MeshDevice mesh = line_on(true);
  const int p = mesh.size(), me = mesh.device_id();
  const ShmGroup* g = ShmGroup::find(mesh.comm());
  if (g == nullptr) GTEST_SKIP() << "no shared-memory group at np " << p;
  const std::int64_t S = (std::int64_t{5} << 20) / 2 + 4 * p;  // bytes; several chunks
  const std::int64_t n = S / 4;
  // all_reduce: each device writes the other devices' parts of its input and its reduced
  // part (S), and reads p-1 terms of its part and the p-1 other reduced parts (2(p-1)/p·S):
  // over the devices, p·S written and 2(p-1)·S read.
  Moved m = moved_by(*g, [&] { (void)all_reduce(mesh, term(Shape{n}, DType::f32, me)); });
  EXPECT_EQ(m.written, p * S) << "all_reduce";
  EXPECT_EQ(m.read, 2 * (p - 1) * S) << "all_reduce";
  EXPECT_GE(m.steps, p * 2) << "agreement + at least one chunk and its gather, on each device";
  // all_gather of pieces of S/p: each writes its piece and reads the p-1 others.
  const std::int64_t b = n / p;
  m = moved_by(*g, [&] { (void)all_gather(mesh, term(Shape{b}, DType::f32, me)); });
  EXPECT_EQ(m.written, p * b * 4) << "all_gather";
  EXPECT_EQ(m.read, (p - 1) * p * b * 4) << "all_gather";
  // reduce_scatter and all_to_all of p blocks of b elements: each device writes and reads
  // (p-1) blocks (its own block stays out of the window).
  m = moved_by(*g, [&] { (void)reduce_scatter(mesh, term(Shape{p * b}, DType::f32, me)); });
  EXPECT_EQ(m.written, p * (p - 1) * b * 4) << "reduce_scatter";
  EXPECT_EQ(m.read, p * (p - 1) * b * 4) << "reduce_scatter";
  // all_to_all: the same through the window; nothing when its blocks go to MPI's single copy.
  const std::int64_t window = g->window_all_to_all(static_cast<std::size_t>(b) * 4, false) ? 1 : 0;
  m = moved_by(*g, [&] { (void)all_to_all(mesh, term(Shape{p * b}, DType::f32, me)); });
  EXPECT_EQ(m.written, window * p * (p - 1) * b * 4) << "all_to_all";
  EXPECT_EQ(m.read, window * p * (p - 1) * b * 4) << "all_to_all";
  const std::int64_t small = 64;  // 256-byte blocks: always through the window
  m = moved_by(*g, [&] { (void)all_to_all(mesh, term(Shape{p * small}, DType::f32, me)); });
  EXPECT_EQ(m.written, p * (p - 1) * small * 4) << "all_to_all of small blocks";
  EXPECT_EQ(m.read, p * (p - 1) * small * 4) << "all_to_all of small blocks";
}

}  // namespace
}  // namespace meshtest::dist
