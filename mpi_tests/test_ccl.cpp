// Every CCL against a single-device reference and against the plain MPI call, bit for bit:
// every mesh shape that fits np x axis x dim x dtype x reduce op, with uneven and empty sizes.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <ostream>
#include <utility>

#include "dist/ccl/ccl.hpp"
#include "dist/ccl/ccl_log.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {
namespace {

enum class Op { all_gather, reduce_scatter, all_reduce, all_to_all, all_to_all_v, broadcast };

constexpr std::string_view op_name(Op op) {
  constexpr std::string_view names[] = {"all_gather", "reduce_scatter", "all_reduce",
                                        "all_to_all", "all_to_all_v",   "broadcast"};
  return names[static_cast<int>(op)];
}

/// One test case: the op and its options on one mesh shape. `dim` is the dim of all_gather
/// and reduce_scatter, all_to_all's split_dim, broadcast's root (0 or -1 = the last device).
struct Case {
  Op op;
  int rows = 1, cols = 1, axis = kAllAxes;
  DType dtype = DType::f32;
  int dim = 0, concat_dim = 0;
  ReduceOp rop = ReduceOp::sum;
};

std::string case_name(const Case& c) {
  auto d = [](int v) { return v < 0 ? fmt::format("m{}", -v) : std::to_string(v); };
  const std::string rop(reduce_op_name(c.rop));
  const std::string opts = c.op == Op::all_gather       ? "dim" + d(c.dim)
                           : c.op == Op::reduce_scatter ? rop + "_dim" + d(c.dim)
                           : c.op == Op::all_reduce     ? rop
                           : c.op == Op::broadcast
                               ? (c.dim == 0 ? "root0" : "rootlast")
                               : fmt::format("split{}_concat{}", d(c.dim), d(c.concat_dim));
  return fmt::format("{}_{}_axis{}_{}_mesh{}x{}", op_name(c.op), opts,
                     c.axis == kAllAxes ? "all" : std::to_string(c.axis), c.dtype, c.rows, c.cols);
}
[[maybe_unused]] void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

// Cases are made when gtest registers them, after MPI_Init in the test main; the launcher's
// environment is the fallback.
int world_size_for_cases() {
  int init = 0;
  MPI_Initialized(&init);
  int n = 0;
  if (init) MPI_Comm_size(MPI_COMM_WORLD, &n);
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (n <= 0 && std::getenv(var) != nullptr) n = std::atoi(std::getenv(var));
  }
  return std::max(n, 1);
}

std::vector<Case> make_cases() {
  const int n = world_size_for_cases();
  constexpr int kDims[] = {0, 1, 2, -1};
  constexpr std::pair<int, int> kA2a[] = {{0, 0}, {0, 1}, {1, 0}, {2, 2}, {-1, 1}};
  constexpr std::pair<int, int> kA2av[] = {{0, 0}, {-1, -1}, {0, 2}};
  std::vector<Case> out;
  for (int rows = 1; rows <= n; ++rows) {
    if (n % rows != 0) continue;
    for (int axis : {0, 1, kAllAxes}) {
      for (DType t : kAllDTypes) {
        const Case base{
            .op = Op::all_gather, .rows = rows, .cols = n / rows, .axis = axis, .dtype = t};
        auto add = [&](Op op, int dim, int concat_dim = 0, ReduceOp rop = ReduceOp::sum) {
          Case c = base;
          c.op = op, c.dim = dim, c.concat_dim = concat_dim, c.rop = rop;
          out.push_back(c);
        };
        for (int d : kDims) add(Op::all_gather, d);
        for (auto [s, c] : kA2a) add(Op::all_to_all, s, c);
        for (auto [s, c] : kA2av) add(Op::all_to_all_v, s, c);
        for (int root : {0, -1}) add(Op::broadcast, root);
        if (t == DType::u8) continue;  // no reductions on u8 (see test_ccl_bad_input)
        for (ReduceOp r : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg}) {
          if (r == ReduceOp::avg && !is_floating(t)) continue;
          add(Op::all_reduce, 0, 0, r);
          for (int d : kDims) {
            if (r == ReduceOp::sum || d == 0 || d == -1) add(Op::reduce_scatter, d, 0, r);
          }
        }
      }
    }
  }
  return out;
}

// ---- single-device side: inputs, groups, references ----------------------------------------

const Shape kBase{2, 3, 2};  // the tested dim is overridden per case

/// Device `device`'s input: small integers (-8..8; 0..16 for u8) so every sum is exact.
Tensor input(int device, const Shape& shape, DType t) {
  std::vector<double> v(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<double>((device * 37 + static_cast<int>(i) * 11 + 5) % 17) -
           (t == DType::u8 ? 0 : 8);
  }
  return Tensor::from_vector(shape, v).astype(t);
}

/// The device ids of this device's group along `axis`, in axis order (DESIGN: Mesh).
struct Group {
  std::vector<int> devices;
  int index = 0;
  int p() const { return static_cast<int>(devices.size()); }
};

Group group_of(const MeshDevice& mesh, int axis) {
  const int cols = mesh.cols(), id = mesh.device_id(), r = id / cols, c = id % cols;
  Group g;
  if (axis == 0) {
    for (int i = 0; i < mesh.rows(); ++i) g.devices.push_back(i * cols + c);
  } else if (axis == 1) {
    for (int i = 0; i < cols; ++i) g.devices.push_back(r * cols + i);
  } else {
    for (int i = 0; i < mesh.size(); ++i) g.devices.push_back(i);
  }
  g.index = static_cast<int>(std::ranges::find(g.devices, id) - g.devices.begin());
  return g;
}

/// Element-wise reduction in f64 (exact for these inputs); avg divides once and rounds to the
/// dtype like the device does (bf16: via f32).
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
  return t == DType::bf16 ? acc.astype(DType::f32).astype(t) : acc.astype(t);
}

/// Sizes along the tested dim: even, then the uneven array_split cases, then empty.
std::vector<std::int64_t> sizes_for(int p) { return {2 * p, p + 1, 2 * p - 1, 1, 0}; }

// ---- checks ----------------------------------------------------------------------------------

const MeshDevice& mesh_of(int rows, int cols) {
  static std::map<std::pair<int, int>, MeshDevice> meshes;  // collective creation, same order
  return meshes.try_emplace({rows, cols}, std::vector<int>{rows, cols}).first->second;
}

std::string show(const Tensor& t) {
  std::vector<double> v;
  for (std::int64_t i = 0; i < std::min<std::int64_t>(t.numel(), 24); ++i) v.push_back(t.item(i));
  return fmt::format("{} {{{}{}}}", describe(t), fmt::join(v, ", "), t.numel() > 24 ? ", ..." : "");
}

void expect_bitwise(const Tensor& got, const Tensor& want, std::string_view against) {
  EXPECT_TRUE(got.bitwise_equal(want))
      << "against " << against << ": got " << show(got) << ", expected " << show(want);
}

/// Runs a CCL; a meshtest::Error (thrown alike on every device) becomes a test failure.
template <class F>
Tensor guarded(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
    return Tensor();
  }
}

MPI_Datatype mpi_type(DType t) {  // the test's own map, for the direct MPI calls
  return t == DType::f32   ? MPI_FLOAT
         : t == DType::f64 ? MPI_DOUBLE
         : t == DType::i32 ? MPI_INT32_T
                           : MPI_INT64_T;
}
MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::max ? MPI_MAX : op == ReduceOp::min ? MPI_MIN : MPI_SUM;
}
bool mpi_can_reduce(const Case& c) { return c.dtype != DType::bf16 && c.rop != ReduceOp::avg; }

std::vector<int> byte_counts(const std::vector<Tensor>& parts, std::vector<int>* displs) {
  std::vector<int> counts;
  int at = 0;
  for (const Tensor& t : parts) {
    counts.push_back(static_cast<int>(t.nbytes()));
    if (displs != nullptr) displs->push_back(at);
    at += counts.back();
  }
  return counts;
}

void check_all_gather(const Case& c, const MeshDevice& mesh, const Group& g, MPI_Comm comm) {
  const int d = kBase.normalize_dim(c.dim), p = g.p();
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> variants;
  for (std::int64_t n : sizes_for(p))
    variants.emplace_back(fmt::format("n = {}", n), split_sizes(n, p));
  variants.emplace_back("ragged: device i has i % 3", std::vector<std::int64_t>{});
  for (int i = 0; i < p; ++i) variants.back().second.push_back(i % 3);
  for (const auto& [label, sizes] : variants) {
    SCOPED_TRACE(fmt::format("{} along dim {}: sizes {}", label, d, fmt::join(sizes, ", ")));
    std::vector<Tensor> parts;
    for (int i = 0; i < p; ++i)
      parts.push_back(input(g.devices[i], kBase.with(d, sizes[i]), c.dtype));
    const Tensor& x = parts[static_cast<std::size_t>(g.index)];
    const Tensor got = guarded([&] { return all_gather(mesh, x, {.dim = c.dim, .axis = c.axis}); });
    const Tensor want = concat(parts, d);
    expect_bitwise(got, want, "reference (concat of every device's input)");
    if (d != 0 || want.empty()) continue;
    Tensor direct(want.shape(), c.dtype);
    std::vector<int> displs;
    const std::vector<int> counts = byte_counts(parts, &displs);
    if (std::ranges::adjacent_find(counts, std::ranges::not_equal_to{}) == counts.end()) {
      MPI_Allgather(x.bytes(), counts[0], MPI_BYTE, direct.bytes(), counts[0], MPI_BYTE, comm);
    } else {
      MPI_Allgatherv(x.bytes(), counts[static_cast<std::size_t>(g.index)], MPI_BYTE, direct.bytes(),
                     counts.data(), displs.data(), MPI_BYTE, comm);
    }
    expect_bitwise(got, direct, "MPI_Allgather(v)");
  }
}

void check_reduce_scatter(const Case& c, const MeshDevice& mesh, const Group& g, MPI_Comm comm) {
  const int d = kBase.normalize_dim(c.dim), p = g.p();
  for (std::int64_t n : sizes_for(p)) {
    SCOPED_TRACE(fmt::format("n = {} along dim {}", n, d));
    std::vector<Tensor> xs;
    for (int dev : g.devices) xs.push_back(input(dev, kBase.with(d, n), c.dtype));
    const Tensor& x = xs[static_cast<std::size_t>(g.index)];
    const Tensor got = guarded(
        [&] { return reduce_scatter(mesh, x, {.dim = c.dim, .axis = c.axis, .op = c.rop}); });
    const Tensor want = reduce_ref(xs, c.rop).slice(d, split_range(n, p, g.index));
    expect_bitwise(got, want, "reference (reduce, then slice i)");
    if (d != 0 || x.empty() || !mpi_can_reduce(c)) continue;
    Tensor direct(want.shape(), c.dtype);
    const std::int64_t row = x.numel() / n;
    std::vector<int> counts;
    for (std::int64_t s : split_sizes(n, p)) counts.push_back(static_cast<int>(s * row));
    if (n % p == 0) {
      MPI_Reduce_scatter_block(x.bytes(), direct.bytes(), counts[0], mpi_type(c.dtype),
                               mpi_op(c.rop), comm);
    } else {
      MPI_Reduce_scatter(x.bytes(), direct.bytes(), counts.data(), mpi_type(c.dtype), mpi_op(c.rop),
                         comm);
    }
    expect_bitwise(got, direct, "MPI_Reduce_scatter(_block)");
  }
}

void check_all_reduce(const Case& c, const MeshDevice& mesh, const Group& g, MPI_Comm comm) {
  for (const Shape& shape : {Shape{2, g.p() + 1, 3}, Shape{0, 4}, Shape{}}) {
    SCOPED_TRACE(fmt::format("shape {}", shape));
    std::vector<Tensor> xs;
    for (int dev : g.devices) xs.push_back(input(dev, shape, c.dtype));
    const Tensor& x = xs[static_cast<std::size_t>(g.index)];
    const AllReduceOptions opt{.axis = c.axis, .op = c.rop};
    const Tensor got = guarded([&] { return all_reduce(mesh, x, opt); });
    const Tensor inplace = guarded([&] {
      Tensor y = x;
      all_reduce_inplace(mesh, y, opt);
      return y;
    });
    const Tensor want = reduce_ref(xs, c.rop);
    expect_bitwise(got, want, "reference (element-wise reduction)");
    expect_bitwise(inplace, want, "reference, in place");
    if (x.empty() || !mpi_can_reduce(c)) continue;
    Tensor direct(shape, c.dtype);
    MPI_Allreduce(x.bytes(), direct.bytes(), static_cast<int>(x.numel()), mpi_type(c.dtype),
                  mpi_op(c.rop), comm);
    expect_bitwise(got, direct, "MPI_Allreduce");
  }
}

// all_to_all and all_to_all_v: counts(i, j) = rows along split_dim from axis index i to j.
void check_exchange(const Case& c, const MeshDevice& mesh, const Group& g, MPI_Comm comm,
                    const std::string& label, const std::function<std::int64_t(int, int)>& counts) {
  SCOPED_TRACE(label);
  const int s = kBase.normalize_dim(c.dim), cd = kBase.normalize_dim(c.concat_dim), p = g.p();
  const int me = g.index;
  std::vector<Tensor> xs, pieces;
  std::vector<std::int64_t> mine;
  for (int i = 0; i < p; ++i) {
    std::int64_t n = 0, at = 0;
    for (int j = 0; j < p; ++j) n += counts(i, j);
    for (int j = 0; j < me; ++j) at += counts(i, j);
    xs.push_back(input(g.devices[i], kBase.with(s, n), c.dtype));
    pieces.push_back(xs.back().slice(s, at, counts(i, me)));
  }
  for (int j = 0; j < p; ++j) mine.push_back(counts(me, j));
  const Tensor& x = xs[static_cast<std::size_t>(me)];
  const AllToAllOptions opt{.split_dim = c.dim, .concat_dim = c.concat_dim, .axis = c.axis};
  const Tensor got = guarded([&] {
    return c.op == Op::all_to_all ? all_to_all(mesh, x, opt) : all_to_all_v(mesh, x, mine, opt);
  });
  const Tensor want = concat(pieces, cd);
  expect_bitwise(got, want, "reference (piece i of every device, concatenated)");
  if (s != 0 || cd != 0) return;
  std::vector<int> sc, sd, rd;
  for (std::int64_t j = 0, at = 0; j < p; at += sc.back(), ++j) {
    sc.push_back(static_cast<int>(counts(me, static_cast<int>(j)) * kBase.inner(0) *
                                  static_cast<std::int64_t>(dtype_size(c.dtype))));
    sd.push_back(static_cast<int>(at));
  }
  const std::vector<int> rc = byte_counts(pieces, &rd);
  Tensor direct(want.shape(), c.dtype);
  MPI_Alltoallv(x.bytes(), sc.data(), sd.data(), MPI_BYTE, direct.bytes(), rc.data(), rd.data(),
                MPI_BYTE, comm);
  expect_bitwise(got, direct, "MPI_Alltoallv");
  if (c.op != Op::all_to_all || std::ranges::count(sc, sc[0]) != p || rc != sc) return;
  MPI_Alltoall(x.bytes(), sc[0], MPI_BYTE, direct.bytes(), sc[0], MPI_BYTE, comm);
  expect_bitwise(got, direct, "MPI_Alltoall");
}

void check_all_to_all(const Case& c, const MeshDevice& mesh, const Group& g, MPI_Comm comm) {
  const int p = g.p();
  const bool same = kBase.normalize_dim(c.dim) == kBase.normalize_dim(c.concat_dim);
  for (std::int64_t n : sizes_for(p)) {
    check_exchange(c, mesh, g, comm, fmt::format("n = {} along split_dim", n),
                   [&](int, int j) { return split_range(n, p, j).size; });
  }
  if (same) {  // sizes along split_dim may differ across devices when it is the concat dim
    check_exchange(c, mesh, g, comm, "device i has p + 1 + i % 2 along split_dim",
                   [&](int i, int j) { return split_range(p + 1 + i % 2, p, j).size; });
  }
}

void check_all_to_all_v(const Case& c, const MeshDevice& mesh, const Group& g, MPI_Comm comm) {
  // Pieces concatenated along a dim other than split_dim must agree in size along split_dim.
  const bool same = kBase.normalize_dim(c.dim) == kBase.normalize_dim(c.concat_dim);
  check_exchange(c, mesh, g, comm, "counts (i + 2j) % 3 (or j % 3), zeros included",
                 [&](int i, int j) { return same ? (i + 2 * j) % 3 : j % 3; });
  check_exchange(c, mesh, g, comm, "everything to device 0", [&](int i, int j) {
    return j != 0 ? 0 : same ? i + 1 : 2;
  });
}

void check_broadcast(const Case& c, const MeshDevice& mesh, const Group& g, MPI_Comm comm) {
  const int root = c.dim == 0 ? 0 : g.p() - 1;
  for (const Shape& shape : {Shape{2, g.p() + 1, 3}, Shape{0, 3}}) {
    SCOPED_TRACE(fmt::format("root {} shape {}", root, shape));
    const Tensor want = input(g.devices[static_cast<std::size_t>(root)], shape, c.dtype);
    // Other devices pass something else entirely: it must be ignored.
    const Tensor x = g.index == root ? want : Tensor(Shape{1, 5}, DType::i64);
    const Tensor got = guarded([&] { return broadcast(mesh, x, {.root = root, .axis = c.axis}); });
    expect_bitwise(got, want, "reference (the root's input)");
    if (want.empty()) continue;
    Tensor direct = g.index == root ? want : Tensor(shape, c.dtype);
    MPI_Bcast(direct.bytes(), static_cast<int>(direct.nbytes()), MPI_BYTE, root, comm);
    expect_bitwise(got, direct, "MPI_Bcast");
  }
}

class Ccl : public ::testing::TestWithParam<Case> {};

TEST_P(Ccl, MatchesReferenceAndMpi) {
  const Case& c = GetParam();
  const MeshDevice& mesh = mesh_of(c.rows, c.cols);
  const Group g = group_of(mesh, c.axis);
  ASSERT_EQ(g.p(), mesh.axis_size(c.axis));  // same on every device: no collective skipped
  ASSERT_EQ(g.index, mesh.axis_index(c.axis));
  using Check = void (*)(const Case&, const MeshDevice&, const Group&, MPI_Comm);
  constexpr Check kChecks[] = {check_all_gather, check_reduce_scatter, check_all_reduce,
                               check_all_to_all, check_all_to_all_v,   check_broadcast};
  kChecks[static_cast<int>(c.op)](c, mesh, g, mesh.comm(c.axis));
}

INSTANTIATE_TEST_SUITE_P(Mesh, Ccl, ::testing::ValuesIn(make_cases()),
                         [](const auto& info) { return case_name(info.param); });

TEST(CclLog, RecordsOpShapeDimsAndAxis) {
  const MeshDevice& mesh = mesh_of(1, world_size_for_cases());
  const Tensor x = input(mesh.device_id(), Shape{2, 3, 2}, DType::f32);
  all_gather(mesh, x, {.dim = 1, .axis = 1});
  const CollectiveEntry e = ccl_log_last();
  EXPECT_EQ(e.op, "all_gather");
  EXPECT_EQ(e.detail, "f32[2, 3, 2] dim 1 axis 1");
  EXPECT_TRUE(e.completed);
  all_to_all(mesh, x, {.split_dim = 1, .concat_dim = -1});
  EXPECT_EQ(ccl_log_last().detail, "f32[2, 3, 2] split_dim 1 concat_dim -1 axis all");
}

TEST(CclBusFactor, FollowsNcclTests) {
  for (int n : {1, 2, 3, 8}) {
    SCOPED_TRACE(fmt::format("n = {}", n));
    EXPECT_DOUBLE_EQ(all_reduce_bw::bus_factor(n), 2.0 * (n - 1) / n);
    EXPECT_DOUBLE_EQ(all_gather_bw::bus_factor(n), (n - 1.0) / n);
    EXPECT_DOUBLE_EQ(reduce_scatter_bw::bus_factor(n), (n - 1.0) / n);
    EXPECT_DOUBLE_EQ(all_to_all_bw::bus_factor(n), (n - 1.0) / n);
    EXPECT_DOUBLE_EQ(broadcast_bw::bus_factor(n), 1.0);
  }
  EXPECT_THROW(all_reduce_bw::bus_factor(0), Error);
}

}  // namespace
}  // namespace meshtest::dist
