// Every CCL against a single-device reference and against the plain MPI call, bit for bit:
// every mesh shape that fits np x axis x dim x dtype x reduce op, with uneven and empty sizes.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dist/ccl/ccl.hpp"
#include "mpi_tests/support/ccl_cases.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist::ccl_test {
namespace {

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

}  // namespace
}  // namespace meshtest::dist::ccl_test
