// The shared-memory path of the CCLs (dist/ccl/shm.hpp): messages of several chunks with a
// ragged tail, every dtype, against references computed here from every device's input and
// against the direct MPI call; outputs equal across devices; agreement failures after the
// group exists; the path turned off on one device.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "dist/ccl/ccl.hpp"
#include "dist/ccl/paths/shm/shm.hpp"
#include "mpi_tests/support/ccl_expect_error.hpp"
#include "mpi_tests/support/scale.hpp"
#include "src/core/random.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {
namespace {

using detail::ShmGroup;

constexpr DType kTypes[] = {DType::f32, DType::bf16, DType::f16,
                            DType::f64, DType::i32,  DType::i64};

/// Device j's value at residue r in [0, 17): an integer in [-8, 8], so every sum, max and min
/// is exact in every dtype.
double residue_value(int j, std::int64_t r) {
  return static_cast<double>((static_cast<std::int64_t>(j) * 37 + r) % 17) - 8;
}

/// Element i of device j's input: its value at residue (11 i + 5) % 17.
double input_value(std::int64_t i, int j) { return residue_value(j, (i * 11 + 5) % 17); }

/// Elements [first, first + n) of device j's (flat) input values.
std::vector<double> input_values(std::int64_t n, int j, std::int64_t first = 0) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = input_value(first + static_cast<std::int64_t>(i), j);
  }
  return v;
}

Tensor input(const Shape& shape, DType t, int j) {
  return Tensor::from_vector(shape, input_values(shape.numel(), j)).astype(t);
}

/// Rows [row, row + rows) of device j's input of `shape` (rows along dim 0), without making the
/// rest: input(shape, t, j).slice(0, row, rows).
Tensor input_rows(const Shape& shape, DType t, int j, std::int64_t row, std::int64_t rows) {
  const std::int64_t inner = shape.numel() / shape[0];
  return Tensor::from_vector(shape.with(0, rows), input_values(rows * inner, j, row * inner))
      .astype(t);
}

std::vector<double> values(const Tensor& t) {
  const Tensor d = t.astype(DType::f64);
  const auto s = d.span<double>();
  return {s.begin(), s.end()};
}

/// Element-wise reduction of every device's input, in f64 (exact for these inputs). Element i
/// depends only on (11 i + 5) % 17: each of the 17 residues is reduced over the p devices once,
/// so that the reference costs as much at 32 devices as at 2.
std::vector<double> reduced(const Shape& shape, int p, ReduceOp op) {
  std::array<double, 17> by_residue{};
  for (std::int64_t r = 0; r < 17; ++r) {
    double acc = residue_value(0, r);
    for (int j = 1; j < p; ++j) {
      const double v = residue_value(j, r);
      acc = op == ReduceOp::max   ? std::max(acc, v)
            : op == ReduceOp::min ? std::min(acc, v)
                                  : acc + v;
    }
    by_residue[static_cast<std::size_t>(r)] = acc;
  }
  std::vector<double> out(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = by_residue[(static_cast<std::size_t>(i) * 11 + 5) % 17];
  }
  return out;
}

/// Elements of `t` that span 2.5 steps of `bytes_per_step`, plus a ragged tail of 3.
std::int64_t multi_chunk(std::size_t bytes_per_step, DType t) {
  return static_cast<std::int64_t>(5 * bytes_per_step / 2 / dtype_size(t)) + 3;
}

/// The group of the whole line mesh, made by one agreed call.
ShmGroup* group_of(const MeshDevice& mesh) {
  Tensor one(Shape{1}, DType::i32);
  one.fill(1);
  all_reduce(mesh, one);
  return ShmGroup::find(mesh.comm());
}

/// Skips the test (on every device alike) when the mesh's devices span nodes: such a group has
/// no shared-memory path, and its CCLs take the MPI path (test_ccl covers them there).
#define SKIP_UNLESS_ONE_NODE(mesh)                                                       \
  if (!ShmGroup::one_node((mesh).comm()))                                                \
  GTEST_SKIP() << "the devices span nodes: the shared-memory path is for one node only " \
                  "(this group takes the MPI path)"

TEST(CclShm, GroupIsMadeByTheFirstAgreedCall) {
  const MeshDevice mesh = MeshDevice::line();
  SKIP_UNLESS_ONE_NODE(mesh);
  EXPECT_EQ(ShmGroup::find(mesh.comm()), nullptr) << "no call yet";
  ShmGroup* g = group_of(mesh);
  ASSERT_EQ(g != nullptr, mesh.size() > 1) << "one node, the path on: a group iff p > 1";
  if (g == nullptr) return;
  EXPECT_EQ(g->size(), mesh.size());
  EXPECT_EQ(g->index(), mesh.device_id());
  EXPECT_EQ(ShmGroup::find(mesh.comm(1)), nullptr) << "axis 1's communicator: no call yet";
}

TEST(CclShm, MultiChunkCallsMatchReferences) {
  const MeshDevice mesh = MeshDevice::line();
  const int p = mesh.size(), me = mesh.device_id();
  const ShmGroup* g = group_of(mesh);
  const std::size_t chunk = g != nullptr ? g->chunk() : ShmGroup::kChunk / 4;
  const std::size_t sub = chunk / static_cast<std::size_t>(p) / 64 * 64;  // per block per step
  // Above 8 ranks two of the types, in turn (support/scale.hpp): the references are p^2 work.
  for (DType t : test_support::sample_at_scale(std::span<const DType>(kTypes), p, 2)) {
    SCOPED_TRACE(fmt::format("{}", t));
    // all_reduce (and in place) of 2.5 chunks + 3 elements.
    const Shape flat{multi_chunk(chunk, t)};
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
      SCOPED_TRACE(reduce_op_name(op));
      const std::vector<double> want = reduced(flat, p, op);
      EXPECT_EQ(values(all_reduce(mesh, input(flat, t, me), {.op = op})), want);
      Tensor x = input(flat, t, me);
      all_reduce_inplace(mesh, x, {.op = op});
      EXPECT_EQ(values(x), want);
    }
    // all_gather along dim 0 of [m, 3] pieces of 2.5 chunks.
    const Shape piece{multi_chunk(chunk, t) / 3, 3};
    std::vector<Tensor> parts;
    for (int j = 0; j < p; ++j) parts.push_back(input(piece, t, j));
    EXPECT_TRUE(all_gather(mesh, input(piece, t, me), {.dim = 0}).bitwise_equal(concat(parts, 0)));
    // all_to_all along dim 0 and reduce_scatter along dims 0 and 1: blocks of 2.5 steps.
    const std::int64_t m = multi_chunk(sub, t) / 3;
    const Shape x_shape{p * m, 3};
    std::vector<Tensor> mine;
    for (int j = 0; j < p; ++j) mine.push_back(input_rows(x_shape, t, j, me * m, m));
    EXPECT_TRUE(all_to_all(mesh, input(x_shape, t, me), {.split_dim = 0, .concat_dim = 0})
                    .bitwise_equal(concat(mine, 0)));
    const std::vector<double> sum = reduced(x_shape, p, ReduceOp::sum);
    const std::vector<double> block(sum.begin() + me * m * 3, sum.begin() + (me + 1) * m * 3);
    EXPECT_EQ(values(reduce_scatter(mesh, input(x_shape, t, me), {.dim = 0})), block);
    // Along dim 1 of [3, p * m]: packed into blocks, then the same ring.
    const Shape y_shape{3, p * m};
    const std::vector<double> ysum = reduced(y_shape, p, ReduceOp::sum);
    std::vector<double> ywant;
    for (std::int64_t r = 0; r < 3; ++r) {
      const auto at = ysum.begin() + r * p * m + me * m;
      ywant.insert(ywant.end(), at, at + m);
    }
    EXPECT_EQ(values(reduce_scatter(mesh, input(y_shape, t, me), {.dim = 1})), ywant);
  }
}

TEST(CclShm, FloatAllReduceIsEqualOnEveryDeviceAndMatchesMpiAtTwo) {
  const MeshDevice mesh = MeshDevice::line();
  const int p = mesh.size();
  const std::size_t chunk = ShmGroup::kChunk;  // at least two steps in either mode
  const Shape shape{multi_chunk(chunk, DType::f32)};
  const Tensor x = random_normal(
      shape, DType::f32, {.seed = 5, .stream = static_cast<std::uint64_t>(mesh.device_id())});
  const Tensor got = all_reduce(mesh, x);
  // Rank 0's result on every rank: replicated outputs must be equal bit for bit.
  Tensor first = got;
  MPI_Bcast(first.bytes(), static_cast<int>(first.nbytes()), MPI_BYTE, 0, mesh.comm());
  EXPECT_TRUE(got.bitwise_equal(first)) << "all_reduce differs between devices";
  if (p != 2) return;  // x_0 + x_1 is MPI's sum too only when there are two terms
  Tensor direct(shape, DType::f32);
  MPI_Allreduce(x.bytes(), direct.bytes(), static_cast<int>(x.numel()), MPI_FLOAT, MPI_SUM,
                mesh.comm());
  EXPECT_TRUE(got.bitwise_equal(direct)) << "differs from MPI_Allreduce";
}

TEST(CclShm, DisagreementAfterTheGroupExistsGivesTheFullErrorAndStaysInStep) {
  const MeshDevice mesh = MeshDevice::line();
  const int p = mesh.size(), me = mesh.device_id();
  if (p == 1) GTEST_SKIP() << "needs two devices";
  SKIP_UNLESS_ONE_NODE(mesh);
  ASSERT_NE(group_of(mesh), nullptr);
  const Shape shape{me == p - 1 ? 5 : 4};
  ccl_test::expect_error(mesh, kAllAxes, "shape differs on the last device",
                         [&] { all_reduce(mesh, input(shape, DType::f32, me)); },
                         {"shapes disagree", fmt::format("device {}", p - 1)});
  ccl_test::expect_error(
      mesh, kAllAxes, "bad dim on device 0",
      [&] { all_gather(mesh, input(Shape{4}, DType::f32, me), {.dim = me == 0 ? 3 : 0}); },
      {"dim 3 out of range", "device 0"});
  // Still in step: a multi-chunk call is right.
  const Shape flat{multi_chunk(ShmGroup::kChunk, DType::i32)};
  EXPECT_EQ(values(all_reduce(mesh, input(flat, DType::i32, me))), reduced(flat, p, ReduceOp::sum));
}

TEST(CclShm, ManySmallCallsWrapTheSlotRing) {
  const MeshDevice mesh = MeshDevice::line();
  const int p = mesh.size(), me = mesh.device_id();
  for (int i = 0; i < 5 * static_cast<int>(ShmGroup::kSlots); ++i) {
    const Shape s{p * (i + 1)};
    if (i % 2 == 0) {
      EXPECT_EQ(values(all_reduce(mesh, input(s, DType::i64, me))), reduced(s, p, ReduceOp::sum))
          << "call " << i;
    } else {
      std::vector<Tensor> parts;
      for (int j = 0; j < p; ++j) parts.push_back(input(s, DType::i32, j));
      EXPECT_TRUE(all_gather(mesh, input(s, DType::i32, me)).bitwise_equal(concat(parts, 0)))
          << "call " << i;
    }
  }
}

TEST(CclShm, TurnedOffOnOneDeviceMeansNoGroupAnywhere) {
  const int me = [] {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }();
  ShmGroup::set_enabled(me != 0);
  {
    const MeshDevice mesh = MeshDevice::line();
    EXPECT_EQ(group_of(mesh), nullptr);
    const Shape flat{multi_chunk(ShmGroup::kChunk, DType::f32)};
    EXPECT_EQ(values(all_reduce(mesh, input(flat, DType::f32, me))),
              reduced(flat, mesh.size(), ReduceOp::sum));
  }
  ShmGroup::set_enabled(true);
  const MeshDevice mesh = MeshDevice::line();
  const bool one_node = ShmGroup::one_node(mesh.comm());
  EXPECT_EQ(group_of(mesh) != nullptr, mesh.size() > 1 && one_node);
}

}  // namespace
}  // namespace meshtest::dist
