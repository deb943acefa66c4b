// Bad input to the CCLs: every device of the group gets the same meshtest::Error (never a hang),
// and the group stays in step afterwards. Every mesh shape that fits np, every axis.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <climits>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "dist/ccl/ccl.hpp"
#include "dist/ccl/detail.hpp"
#include "mpi_tests/support/ccl_expect_error.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {
namespace {

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

const MeshDevice& mesh_of(int rows, int cols) {
  static std::map<std::pair<int, int>, MeshDevice> meshes;  // collective creation, same order
  return meshes.try_emplace({rows, cols}, std::vector<int>{rows, cols}).first->second;
}

/// Calls f(mesh, axis) for every mesh shape that fits np and every axis, with a trace naming
/// both; `min_p` skips groups that are too small to disagree (the same on every device).
void for_each_group(const std::function<void(const MeshDevice&, int)>& f, int min_p = 1) {
  const int n = world_size();
  for (int rows = 1; rows <= n; ++rows) {
    if (n % rows != 0) continue;
    const MeshDevice& mesh = mesh_of(rows, n / rows);
    for (int axis : {0, 1, kAllAxes}) {
      if (mesh.axis_size(axis) < min_p) continue;
      SCOPED_TRACE(fmt::format("mesh {} axis {}", mesh.str(), axis));
      f(mesh, axis);
    }
  }
}

/// The device id of axis index i in this device's group.
int device_at(const MeshDevice& mesh, int axis, int i) {
  const auto [r, c] = mesh.coord();
  return axis == 0 ? mesh.device_at(i, c) : axis == 1 ? mesh.device_at(r, i) : i;
}

Tensor iota(const Shape& s, DType t) {
  std::vector<double> v(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i % 7);
  return Tensor::from_vector(s, v).astype(t);
}

using ccl_test::expect_error;

const Shape kShape{2, 3, 2};

TEST(CclBadInput, DimOutOfRange) {
  for_each_group([](const MeshDevice& mesh, int axis) {
    const Tensor x = iota(kShape, DType::f32);
    const std::string range = "out of range [-3, 3) for x f32[2, 3, 2]";
    expect_error(mesh, axis, "all_gather dim 3",
                 [&] {
                   all_gather(mesh, x, {3, axis});
                 },
                 {"all_gather on axis", "dim 3 " + range});
    expect_error(mesh, axis, "all_gather dim -4",
                 [&] {
                   all_gather(mesh, x, {-4, axis});
                 },
                 {"dim -4 " + range});
    expect_error(mesh, axis, "all_gather of a scalar",
                 [&] {
                   all_gather(mesh, Tensor({}, DType::f32), {0, axis});
                 },
                 {"dim 0 out of range [0, 0) for x f32[]"});
    expect_error(mesh, axis, "reduce_scatter dim 3",
                 [&] { reduce_scatter(mesh, x, {.dim = 3, .axis = axis}); },
                 {"reduce_scatter on axis", "dim 3 " + range});
    expect_error(mesh, axis, "all_to_all split_dim 3",
                 [&] { all_to_all(mesh, x, {.split_dim = 3, .axis = axis}); },
                 {"split_dim 3 " + range});
    expect_error(mesh, axis, "all_to_all concat_dim -4",
                 [&] { all_to_all(mesh, x, {.concat_dim = -4, .axis = axis}); },
                 {"concat_dim -4 " + range});
    const std::vector<std::int64_t> counts(static_cast<std::size_t>(mesh.axis_size(axis)), 0);
    expect_error(mesh, axis, "all_to_all_v split_dim 7",
                 [&] { all_to_all_v(mesh, x, counts, {.split_dim = 7, .axis = axis}); },
                 {"all_to_all_v on axis", "split_dim 7 " + range});
  });
}

TEST(CclBadInput, AxisOutOfRange) {
  const MeshDevice& mesh = mesh_of(1, world_size());
  const Tensor x = iota(kShape, DType::f32);
  Tensor y = x;
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(mesh.size()), 0);
  for (int axis : {2, -2}) {
    const std::string bad =
        fmt::format("axis {} out of range: valid axes are 0, 1 and kAllAxes (-1)", axis);
    expect_error(mesh, axis, "all_gather", [&] { all_gather(mesh, x, {.axis = axis}); }, {bad});
    expect_error(mesh, axis, "reduce_scatter", [&] { reduce_scatter(mesh, x, {.axis = axis}); },
                 {bad});
    expect_error(mesh, axis, "all_reduce", [&] { all_reduce(mesh, x, {.axis = axis}); }, {bad});
    expect_error(mesh, axis, "all_reduce_inplace",
                 [&] { all_reduce_inplace(mesh, y, {.axis = axis}); }, {bad});
    expect_error(mesh, axis, "all_to_all", [&] { all_to_all(mesh, x, {.axis = axis}); }, {bad});
    expect_error(mesh, axis, "all_to_all_v", [&] { all_to_all_v(mesh, x, counts, {.axis = axis}); },
                 {bad});
    expect_error(mesh, axis, "broadcast", [&] { broadcast(mesh, x, {.axis = axis}); }, {bad});
  }
}

TEST(CclBadInput, AllToAllVCounts) {
  for_each_group([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis), me = mesh.axis_index(axis);
    const Tensor x = iota(Shape{3, 2}, DType::f32);  // 3 rows along split_dim 0
    std::vector<std::int64_t> ok(static_cast<std::size_t>(p), 0);
    ok[0] = 3;
    const std::string last =
        fmt::format("device {} (axis index {})", device_at(mesh, axis, p - 1), p - 1);
    const std::string first = fmt::format("device {} (axis index 0)", device_at(mesh, axis, 0));
    std::vector<std::int64_t> longer = ok;
    longer.push_back(0);
    expect_error(
        mesh, axis, "all_to_all_v with p + 1 counts everywhere",
        [&] { all_to_all_v(mesh, x, longer, {.axis = axis}); },
        {fmt::format("send_counts has {} entries but the axis group has {} devices", p + 1, p)});
    expect_error(mesh, axis, "all_to_all_v with p + 1 counts on the last device only",
                 [&] { all_to_all_v(mesh, x, me == p - 1 ? longer : ok, {.axis = axis}); },
                 {last, "send_counts has"});
    std::vector<std::int64_t> short_sum = ok;
    short_sum[0] = 2;
    expect_error(mesh, axis, "all_to_all_v counts summing to 2 on axis index 0",
                 [&] { all_to_all_v(mesh, x, me == 0 ? short_sum : ok, {.axis = axis}); },
                 {first, "send_counts sum to 2 but x f32[3, 2] has 3 along split_dim 0"});
    std::vector<std::int64_t> negative = ok;
    negative[0] = -1;
    expect_error(mesh, axis, "all_to_all_v with a negative count",
                 [&] { all_to_all_v(mesh, x, negative, {.axis = axis}); },
                 {"send_counts[0] is -1; counts must be >= 0"});
    if (p < 2) return;
    // split_dim != concat_dim: what device 0 receives must agree along split_dim.
    std::vector<std::int64_t> uneven(static_cast<std::size_t>(p), 0);
    uneven[0] = me == 0 ? 3 : 0;
    uneven[1] = me == 0 ? 0 : 3;
    expect_error(
        mesh, axis, "all_to_all_v split 0 concat 1 with uneven pieces",
        [&] { all_to_all_v(mesh, x, uneven, {.split_dim = 0, .concat_dim = 1, .axis = axis}); },
        {"must agree in size along dim 0", "gets 3 from " + first});
  });
}

TEST(CclBadInput, MixedDtypes) {
  for_each_group(
      [](const MeshDevice& mesh, int axis) {
        const int me = mesh.axis_index(axis), p = mesh.axis_size(axis);
        const Tensor x = iota(kShape, me == 0 ? DType::f64 : DType::f32);
        Tensor y = x;
        const std::vector<std::int64_t> counts = split_sizes(2, p);
        const std::string first =
            fmt::format("device {} (axis index 0) passes f64", device_at(mesh, axis, 0));
        const std::initializer_list<std::string> needles = {"mixed dtypes across the group", first,
                                                            "passes f32"};
        expect_error(
            mesh, axis, "all_gather", [&] { all_gather(mesh, x, {.axis = axis}); }, needles);
        expect_error(
            mesh, axis, "reduce_scatter", [&] { reduce_scatter(mesh, x, {.axis = axis}); },
            needles);
        expect_error(
            mesh, axis, "all_reduce", [&] { all_reduce(mesh, x, {.axis = axis}); }, needles);
        expect_error(
            mesh, axis, "all_reduce_inplace", [&] { all_reduce_inplace(mesh, y, {.axis = axis}); },
            needles);
        expect_error(
            mesh, axis, "all_to_all", [&] { all_to_all(mesh, x, {.axis = axis}); }, needles);
        expect_error(
            mesh, axis, "all_to_all_v", [&] { all_to_all_v(mesh, x, counts, {.axis = axis}); },
            needles);
      },
      2);
}

TEST(CclBadInput, F16AndBf16AreTwoDtypes) {
  // Both are 2 bytes an element: the agreement tells them apart by dtype, not by size.
  for_each_group(
      [](const MeshDevice& mesh, int axis) {
        const Tensor x = iota(kShape, mesh.axis_index(axis) == 0 ? DType::f16 : DType::bf16);
        const std::string first =
            fmt::format("device {} (axis index 0) passes f16", device_at(mesh, axis, 0));
        expect_error(mesh, axis, "all_reduce", [&] { all_reduce(mesh, x, {.axis = axis}); },
                     {"mixed dtypes across the group", first, "passes bf16"});
      },
      2);
}

TEST(CclBadInput, ShapesDisagree) {
  for_each_group(
      [](const MeshDevice& mesh, int axis) {
        const int me = mesh.axis_index(axis), p = mesh.axis_size(axis);
        const bool last = me == p - 1;
        const std::string dev =
            fmt::format("device {} (axis index {})", device_at(mesh, axis, p - 1), p - 1);
        const std::string who = dev + " passes";
        const Tensor x = iota(last ? Shape{3, 3, 2} : kShape, DType::f32);  // differs along dim 0
        expect_error(mesh, axis, "all_gather dim 1",
                     [&] { all_gather(mesh, x, {.dim = 1, .axis = axis}); },
                     {"shapes disagree outside dim 1", who + " f32[3, 3, 2]"});
        expect_error(mesh, axis, "reduce_scatter dim 1",
                     [&] { reduce_scatter(mesh, x, {.dim = 1, .axis = axis}); },
                     {"shapes disagree", who + " f32[3, 3, 2]"});
        expect_error(mesh, axis, "all_reduce", [&] { all_reduce(mesh, x, {.axis = axis}); },
                     {"shapes disagree", who});
        expect_error(mesh, axis, "all_to_all split 0 concat 1",
                     [&] { all_to_all(mesh, x, {.split_dim = 0, .concat_dim = 1, .axis = axis}); },
                     {"shapes disagree", who, "split_dim 0 differs from concat_dim 1"});
        const Tensor flat = iota(last ? Shape{6, 2} : kShape, DType::f32);  // rank 2 vs rank 3
        expect_error(mesh, axis, "all_reduce rank 2 vs 3",
                     [&] { all_reduce(mesh, flat, {.axis = axis}); },
                     {"shapes disagree", who + " f32[6, 2]"});
        expect_error(mesh, axis, "all_gather dim 2 on a rank-2 tensor",
                     [&] { all_gather(mesh, flat, {.dim = 2, .axis = axis}); },
                     {"dim 2 out of range [-2, 2) for x f32[6, 2]", dev + ": dim 2"});
      },
      2);
}

TEST(CclBadInput, OptionsDisagree) {
  for_each_group(
      [](const MeshDevice& mesh, int axis) {
        const int me = mesh.axis_index(axis);
        const Tensor x = iota(kShape, DType::f32);
        expect_error(mesh, axis, "all_gather dim 1 vs 0",
                     [&] { all_gather(mesh, x, {.dim = me == 0 ? 1 : 0, .axis = axis}); },
                     {"devices disagree on dim", "passes 1 but"});
        expect_error(mesh, axis, "all_reduce op max vs sum",
                     [&] {
                       all_reduce(mesh, x,
                                  {.axis = axis, .op = me == 0 ? ReduceOp::max : ReduceOp::sum});
                     },
                     {"devices disagree on op", "passes max but", "passes sum"});
        expect_error(mesh, axis, "broadcast root 1 vs 0",
                     [&] { broadcast(mesh, x, {.root = me == 0 ? 1 : 0, .axis = axis}); },
                     {"devices disagree on root"});
      },
      2);
}

TEST(CclBadInput, UnsupportedReduce) {
  for_each_group([](const MeshDevice& mesh, int axis) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg}) {
      Tensor x = iota(kShape, DType::u8);
      const std::string bad =
          fmt::format("reduce op {} is not supported for dtype u8", reduce_op_name(op));
      expect_error(mesh, axis, "all_reduce u8",
                   [&] { all_reduce(mesh, x, {.axis = axis, .op = op}); }, {bad});
      expect_error(mesh, axis, "all_reduce_inplace u8",
                   [&] { all_reduce_inplace(mesh, x, {.axis = axis, .op = op}); }, {bad});
      expect_error(mesh, axis, "reduce_scatter u8",
                   [&] { reduce_scatter(mesh, x, {.axis = axis, .op = op}); }, {bad});
    }
    for (DType t : {DType::i32, DType::i64}) {
      const Tensor x = iota(kShape, t);
      const std::string bad = fmt::format("reduce op avg is not supported for dtype {}", t);
      expect_error(mesh, axis, "all_reduce avg",
                   [&] { all_reduce(mesh, x, {.axis = axis, .op = ReduceOp::avg}); }, {bad});
      expect_error(mesh, axis, "reduce_scatter avg",
                   [&] { reduce_scatter(mesh, x, {.dim = 1, .axis = axis, .op = ReduceOp::avg}); },
                   {bad});
    }
  });
}

TEST(CclBadInput, BroadcastRootOutOfRange) {
  for_each_group([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis);
    const Tensor x = iota(kShape, DType::bf16);
    for (int root : {p, -1}) {
      expect_error(mesh, axis, fmt::format("broadcast root {}", root),
                   [&] { broadcast(mesh, x, {.root = root, .axis = axis}); },
                   {fmt::format("root {} out of range [0, {})", root, p)});
    }
  });
}

TEST(CclBadInput, CountBeyondIntThrows) {
  const MeshDevice& mesh = mesh_of(1, world_size());
  const Tensor x = iota(kShape, DType::f32);
  detail::Call call("test_op", mesh, kAllAxes, x, {});  // local checks only
  EXPECT_EQ(call.count(INT_MAX, "a buffer"), INT_MAX);
  try {
    call.count(std::int64_t{INT_MAX} + 1, "a buffer");
    ADD_FAILURE() << "no error for a count beyond INT_MAX";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "a buffer is 2147483648 elements, more than MPI's int count limit"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshtest::dist
