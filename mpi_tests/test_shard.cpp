// test_shard: every placement pair round-trips bit for bit on every mesh shape that fits np.
#include <gtest/gtest.h>
#include <mpi.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "dist/ccl/all_gather.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "dist/shard/placement.hpp"
#include "mpi_tests/support/scale.hpp"
#include "src/core/error.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {
namespace {

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// Every rows x cols mesh with rows * cols = np (1 x np and np x 1 included); above 8 ranks the
/// lines and the squarest shapes (support/scale.hpp): every pair of placements is p^2 work.
std::vector<std::array<int, 2>> mesh_shapes() {
  std::vector<std::array<int, 2>> out;
  const int n = world_size();
  for (int r = 1; r <= n; ++r) {
    if (n % r == 0) out.push_back({r, n / r});
  }
  return test_support::mesh_shapes_at_scale(out);
}

/// Small integers in [-11, 11] built from the element index, so any reduction order is exact.
Tensor global_tensor(const Shape& shape, DType dtype) {
  Tensor t(shape, DType::f64);
  auto v = t.span<double>();
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 37 + 5) % 23) - 11;
  return t.astype(dtype);
}

/// Every (axis 0, axis 1) pair from `per_axis`.
std::vector<Placements> cross(const std::vector<Placement>& per_axis) {
  std::vector<Placements> out;
  for (const Placement& a : per_axis) {
    for (const Placement& b : per_axis) out.push_back({a, b});
  }
  return out;
}

/// Why `got` is not bit-equal to `expected`: dtype/shape, or the first differing element.
std::string mismatch(const Tensor& expected, const Tensor& got) {
  if (expected.dtype() != got.dtype() || !(expected.shape() == got.shape())) {
    return fmt::format("expected {}, got {}", describe(expected), describe(got));
  }
  const std::size_t esz = dtype_size(got.dtype());
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    if (std::memcmp(expected.bytes() + i * esz, got.bytes() + i * esz, esz) != 0) {
      return fmt::format("{}: first difference at flat index {}: expected {}, got {}",
                         describe(got), i, expected.item(i), got.item(i));
    }
  }
  return "equal";
}

/// For every pair (from, to) of placements built from `per_axis`: gather_full(distribute(full,
/// from)) == full and redistribute(distribute(full, from), from, to) == distribute(full, to), bit
/// for bit. Reports at most a few failures per call.
void check_round_trips(const MeshDevice& mesh, const Tensor& full,
                       const std::vector<Placement>& per_axis) {
  const std::vector<Placements> ps = cross(per_axis);
  std::vector<Tensor> locals;
  for (const Placements& p : ps) {
    locals.push_back(distribute(full, mesh, p));
    EXPECT_EQ(locals.back().shape(), local_shape(full.shape(), mesh, p)) << str(p);
  }
  int failures = 0;
  const auto report = [&](const std::string& what, const Tensor& expected, const Tensor& got) {
    if (got.bitwise_equal(expected)) return;
    if (++failures <= 5) {
      ADD_FAILURE() << "mesh " << mesh.str() << " device " << mesh.device_id() << " full "
                    << describe(full) << " " << what << ": " << mismatch(expected, got);
    }
  };
  for (std::size_t i = 0; i < ps.size(); ++i) {
    report(fmt::format("gather_full from {}", ps[i]), full, gather_full(locals[i], mesh, ps[i]));
    for (std::size_t j = 0; j < ps.size(); ++j) {
      report(fmt::format("redistribute {} -> {}", ps[i], ps[j]), locals[j],
             redistribute(locals[i], mesh, ps[i], ps[j]));
    }
  }
  EXPECT_EQ(failures, 0) << "mesh " << mesh.str() << " full " << describe(full);
}

const std::vector<Placement> kSumSet = {Replicate{}, Shard{0}, Shard{1}, Shard{2},
                                        Partial{ReduceOp::sum}};

TEST(Placement, Prints) {
  EXPECT_EQ(fmt::format("{}", Shard{1}), "Shard(1)");
  EXPECT_EQ(fmt::format("{}", Replicate{}), "Replicate");
  EXPECT_EQ(fmt::format("{}", Partial{}), "Partial(sum)");
  EXPECT_EQ(fmt::format("{}", Placement{Partial{ReduceOp::max}}), "Partial(max)");
  EXPECT_EQ(fmt::format("{}", Placements{Shard{0}, Replicate{}}), "[Shard(0), Replicate]");
  EXPECT_EQ(str(placements_1d(Shard{-1})), "[Replicate, Shard(-1)]");
}

/// One test per dtype keeps each well under the per-test deadline at np 8 on 2 cores.
class EveryPair : public ::testing::TestWithParam<DType> {};

TEST_P(EveryPair, RoundTripsExactly) {
  for (const auto& shape : mesh_shapes()) {
    const MeshDevice mesh({shape[0], shape[1]});
    check_round_trips(mesh, global_tensor({5, 7, 3}, GetParam()), kSumSet);
  }
}

INSTANTIATE_TEST_SUITE_P(Placement, EveryPair,
                         ::testing::Values(DType::f32, DType::f64, DType::i32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Placement, EmptyShardsRoundTrip) {
  // Dims smaller than the mesh axes leave some devices with empty shards.
  for (const auto& shape : mesh_shapes()) {
    const MeshDevice mesh({shape[0], shape[1]});
    check_round_trips(mesh, global_tensor({2, 1, 3}, DType::f32), kSumSet);
  }
}

/// Partial(max), Partial(min), Partial(avg): one test per op, two dtypes each (avg: floating).
class OtherReduceOps : public ::testing::TestWithParam<ReduceOp> {};

TEST_P(OtherReduceOps, RoundTripExactly) {
  const ReduceOp op = GetParam();
  const std::vector<Placement> set = {Replicate{}, Shard{0}, Shard{2}, Partial{op}};
  const std::vector<DType> dtypes = op == ReduceOp::avg   ? std::vector{DType::f32, DType::bf16}
                                    : op == ReduceOp::max ? std::vector{DType::f32, DType::i32}
                                                          : std::vector{DType::bf16, DType::i32};
  for (const auto& shape : mesh_shapes()) {
    const MeshDevice mesh({shape[0], shape[1]});
    for (DType dt : dtypes) check_round_trips(mesh, global_tensor({5, 7, 3}, dt), set);
  }
}

INSTANTIATE_TEST_SUITE_P(Placement, OtherReduceOps,
                         ::testing::Values(ReduceOp::max, ReduceOp::min, ReduceOp::avg),
                         [](const auto& info) { return std::string(reduce_op_name(info.param)); });

TEST(Placement, SignedZerosRoundTrip) {
  // Partial(sum) pads with -0.0, so -0.0 and +0.0 elements both come back bit for bit.
  Tensor full = Tensor::from_vector<float>({2, 3}, {-0.0f, 0.0f, 1.0f, -0.0f, -2.0f, 0.0f});
  for (const auto& shape : mesh_shapes()) {
    const MeshDevice mesh({shape[0], shape[1]});
    check_round_trips(mesh, full, {Replicate{}, Shard{1}, Partial{}});
  }
}

TEST(Placement, NestedShardsFollowRowMajorDeviceOrder) {
  // Both axes sharding dim 0: the pieces in row-major device order concatenate to the tensor.
  for (const auto& shape : mesh_shapes()) {
    const MeshDevice mesh({shape[0], shape[1]});
    const Tensor full = global_tensor({11, 2}, DType::f64);
    const Tensor local = distribute(full, mesh, {Shard{0}, Shard{0}});
    const Range outer = split_range(11, mesh.rows(), mesh.coord()[0]);
    const Range inner = split_range(outer.size, mesh.cols(), mesh.coord()[1]);
    EXPECT_TRUE(local.bitwise_equal(full.slice(0, outer.start + inner.start, inner.size)));
    const Tensor all = all_gather(mesh, local, {.dim = 0, .axis = kAllAxes});
    EXPECT_TRUE(all.bitwise_equal(full)) << mismatch(full, all);
  }
}

TEST(Placement, PartialSumCanonicalForm) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor full = global_tensor({3, 4}, DType::i32);
  const Tensor local = distribute(full, mesh, placements_1d(Partial{}));
  if (mesh.axis_index(1) == 0) {
    EXPECT_TRUE(local.bitwise_equal(full));
  } else {
    EXPECT_TRUE(local.bitwise_equal(Tensor(full.shape(), DType::i32)));
  }
  EXPECT_TRUE(distribute(full, mesh, placements_1d(Partial{ReduceOp::max})).bitwise_equal(full));
}

/// Expects `f` to throw meshtest::Error whose message contains `needle` and the rank.
template <class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected meshtest::Error containing '" << needle << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find("[rank "), std::string::npos) << msg;
  }
}

TEST(Placement, ShardDimOutOfRangeThrowsOnEveryRank) {
  const int n = world_size();
  for (const auto& shape : mesh_shapes()) {
    const MeshDevice mesh({shape[0], shape[1]});
    const Tensor full = global_tensor({5, 7, 3}, DType::f32);
    const Placements bad = {Replicate{}, Shard{3}};
    const Placements neg = {Shard{-4}, Replicate{}};
    const Tensor local = distribute(full, mesh, {Shard{0}, Shard{1}});
    expect_error([&] { distribute(full, mesh, bad); }, "Shard(3)");
    expect_error([&] { distribute(full, mesh, neg); }, "Shard(-4)");
    expect_error([&] { local_shape(full.shape(), mesh, bad); }, "Shard(3)");
    expect_error([&] { gather_full(local, mesh, bad); }, "out of range");
    expect_error([&] { redistribute(local, mesh, {Shard{0}, Shard{1}}, bad); }, "Shard(3)");
    expect_error([&] { redistribute(local, mesh, neg, kReplicated); }, "Shard(-4)");
    expect_error([&] { distribute_axis(full, mesh, 2, Replicate{}); }, "mesh axis 2");
    // Every rank threw before communicating: the mesh still works.
    const Tensor again = gather_full(local, mesh, {Shard{0}, Shard{1}});
    EXPECT_TRUE(again.bitwise_equal(full)) << "np " << n;
  }
}

TEST(Placement, UnsupportedPartialsThrowOnEveryRank) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor f = global_tensor({4, 2}, DType::f32);
  expect_error(
      [&] {
        distribute(f, mesh, {Partial{ReduceOp::sum}, Partial{ReduceOp::max}});
      },
      "same op");
  expect_error(
      [&] {
        redistribute(f, mesh, kReplicated, {Partial{ReduceOp::min}, Partial{ReduceOp::avg}});
      },
      "same op");
  expect_error([&] { distribute(global_tensor({4}, DType::u8), mesh, placements_1d(Partial{})); },
               "u8");
  expect_error(
      [&] {
        distribute(global_tensor({4}, DType::i32), mesh, placements_1d(Partial{ReduceOp::avg}));
      },
      "floating dtype");
  // Negative Shard dims count from the end.
  EXPECT_TRUE(distribute(f, mesh, placements_1d(Shard{-1}))
                  .bitwise_equal(distribute(f, mesh, placements_1d(Shard{1}))));
}

}  // namespace
}  // namespace meshtest::dist
