// Every CCL against the exact expected output of dist/ccl/cases.hpp's table and against the
// plain MPI call, bit for bit: every mesh shape that fits np x axis x dim x dtype x reduce op,
// with uneven and empty sizes.
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

#include "dist/ccl/cases.hpp"
#include "dist/ccl/ccl.hpp"
#include "mpi_tests/support/ccl_cases.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist::ccl_test {
namespace {

void check_all_gather(const Case& c, const MeshDevice& mesh, const Group& g, MPI_Comm comm) {
  const int d = kBase.normalize_dim(c.dim), p = g.p();
  const CclCase& cc = ccl_case(c.op);
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> variants;
  for (std::int64_t n : sizes_for(p))
    variants.emplace_back(fmt::format("n = {}", n), split_sizes(n, p));
  variants.emplace_back("ragged: device i has i % 3", std::vector<std::int64_t>{});
  for (int i = 0; i < p; ++i) variants.back().second.push_back(i % 3);
  for (const auto& [label, sizes] : variants) {
    SCOPED_TRACE(fmt::format("{} along dim {}: sizes {}", label, d, fmt::join(sizes, ", ")));
    CclCall call = call_of(c, g, kBase);
    call.sizes = sizes;
    std::vector<Tensor> parts;
    for (int i = 0; i < p; ++i) parts.push_back(cc.input(call, i));
    const Tensor& x = parts[static_cast<std::size_t>(g.index)];
    const Tensor got = guarded([&] { return cc.run(mesh, x, call); });
    const Tensor want = cc.expected(call, g.index);
    expect_bitwise(got, want, "expected (concat of every device's input)");
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
  const CclCase& cc = ccl_case(c.op);
  for (std::int64_t n : sizes_for(p)) {
    SCOPED_TRACE(fmt::format("n = {} along dim {}", n, d));
    const CclCall call = call_of(c, g, kBase.with(d, n));
    const Tensor x = cc.input(call, g.index);
    const Tensor got = guarded([&] { return cc.run(mesh, x, call); });
    const Tensor want = cc.expected(call, g.index);
    expect_bitwise(got, want, "expected (reduce, then slice i)");
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
  const CclCase& cc = ccl_case(c.op);
  for (const Shape& shape : {Shape{2, g.p() + 1, 3}, Shape{0, 4}, Shape{}}) {
    SCOPED_TRACE(fmt::format("shape {}", shape));
    const CclCall call = call_of(c, g, shape);
    const Tensor x = cc.input(call, g.index);
    const Tensor got = guarded([&] { return cc.run(mesh, x, call); });
    const Tensor inplace = guarded([&] {
      Tensor y = x;
      all_reduce_inplace(mesh, y, {.axis = c.axis, .op = c.rop});
      return y;
    });
    const Tensor want = cc.expected(call, g.index);
    expect_bitwise(got, want, "expected (element-wise reduction)");
    expect_bitwise(inplace, want, "expected, in place");
    if (x.empty() || !mpi_can_reduce(c)) continue;
    Tensor direct(shape, c.dtype);
    MPI_Allreduce(x.bytes(), direct.bytes(), static_cast<int>(x.numel()), mpi_type(c.dtype),
                  mpi_op(c.rop), comm);
    expect_bitwise(got, direct, "MPI_Allreduce");
  }
}

// all_to_all and all_to_all_v: `call` sets each device's size along split_dim (sizes) or the
// counts; exchange_range(call, i, j) is then what axis index i sends j.
void check_exchange(const Case& c, const MeshDevice& mesh, const Group& g, MPI_Comm comm,
                    const std::string& label, const CclCall& call) {
  SCOPED_TRACE(label);
  const CclCase& cc = ccl_case(c.op);
  const int s = kBase.normalize_dim(c.dim), cd = kBase.normalize_dim(c.concat_dim), p = g.p();
  const int me = g.index;
  const Tensor x = cc.input(call, me);
  const Tensor got = guarded([&] { return cc.run(mesh, x, call); });
  const Tensor want = cc.expected(call, me);
  expect_bitwise(got, want, "expected (piece i of every device, concatenated)");
  if (s != 0 || cd != 0) return;
  // Bytes per entry along dim 0, the split dim.
  const std::int64_t row = kBase.inner(0) * static_cast<std::int64_t>(dtype_size(c.dtype));
  std::vector<int> sc, sd, rc, rd;
  for (int j = 0, sat = 0, rat = 0; j < p; sat += sc.back(), rat += rc.back(), ++j) {
    sc.push_back(static_cast<int>(exchange_range(call, me, j).size * row));
    rc.push_back(static_cast<int>(exchange_range(call, j, me).size * row));
    sd.push_back(sat);
    rd.push_back(rat);
  }
  Tensor direct(want.shape(), c.dtype);
  MPI_Alltoallv(x.bytes(), sc.data(), sd.data(), MPI_BYTE, direct.bytes(), rc.data(), rd.data(),
                MPI_BYTE, comm);
  expect_bitwise(got, direct, "MPI_Alltoallv");
  if (c.op != CclOp::all_to_all || std::ranges::count(sc, sc[0]) != p || rc != sc) return;
  MPI_Alltoall(x.bytes(), sc[0], MPI_BYTE, direct.bytes(), sc[0], MPI_BYTE, comm);
  expect_bitwise(got, direct, "MPI_Alltoall");
}

void check_all_to_all(const Case& c, const MeshDevice& mesh, const Group& g, MPI_Comm comm) {
  const int p = g.p();
  const bool same = kBase.normalize_dim(c.dim) == kBase.normalize_dim(c.concat_dim);
  for (std::int64_t n : sizes_for(p)) {
    CclCall call = call_of(c, g, kBase.with(c.dim, n));
    check_exchange(c, mesh, g, comm, fmt::format("n = {} along split_dim", n), call);
  }
  if (same) {  // sizes along split_dim may differ across devices when it is the concat dim
    CclCall call = call_of(c, g, kBase);
    for (int i = 0; i < p; ++i) call.sizes.push_back(p + 1 + i % 2);
    check_exchange(c, mesh, g, comm, "device i has p + 1 + i % 2 along split_dim", call);
  }
}

void check_all_to_all_v(const Case& c, const MeshDevice& mesh, const Group& g, MPI_Comm comm) {
  // Pieces concatenated along a dim other than split_dim must agree in size along split_dim.
  const bool same = kBase.normalize_dim(c.dim) == kBase.normalize_dim(c.concat_dim);
  const int p = g.p();
  auto with_counts = [&](const std::function<std::int64_t(int, int)>& counts) {
    CclCall call = call_of(c, g, kBase);
    for (int i = 0; i < p; ++i) {
      for (int j = 0; j < p; ++j) call.counts.push_back(counts(i, j));
    }
    return call;
  };
  check_exchange(c, mesh, g, comm, "counts (i + 2j) % 3 (or j % 3), zeros included",
                 with_counts([&](int i, int j) { return same ? (i + 2 * j) % 3 : j % 3; }));
  check_exchange(c, mesh, g, comm, "everything to device 0", with_counts([&](int i, int j) {
                   return j != 0 ? 0 : same ? i + 1 : 2;
                 }));
}

void check_broadcast(const Case& c, const MeshDevice& mesh, const Group& g, MPI_Comm comm) {
  const CclCase& cc = ccl_case(c.op);
  for (const Shape& shape : {Shape{2, g.p() + 1, 3}, Shape{0, 3}}) {
    const CclCall call = call_of(c, g, shape);
    const int root = call.root;
    SCOPED_TRACE(fmt::format("root {} shape {}", root, shape));
    const Tensor want = cc.expected(call, g.index);
    // Other devices pass something else entirely: it must be ignored.
    const Tensor x = g.index == root ? cc.input(call, root) : Tensor(Shape{1, 5}, DType::i64);
    const Tensor got = guarded([&] { return cc.run(mesh, x, call); });
    expect_bitwise(got, want, "expected (the root's input)");
    if (want.empty()) continue;
    Tensor direct = g.index == root ? x : Tensor(shape, c.dtype);
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
  const MPI_Comm comm = mesh.comm(c.axis);
  switch (c.op) {
    case CclOp::all_gather:
      return check_all_gather(c, mesh, g, comm);
    case CclOp::reduce_scatter:
      return check_reduce_scatter(c, mesh, g, comm);
    case CclOp::all_reduce:
      return check_all_reduce(c, mesh, g, comm);
    case CclOp::all_to_all:
      return check_all_to_all(c, mesh, g, comm);
    case CclOp::all_to_all_v:
      return check_all_to_all_v(c, mesh, g, comm);
    case CclOp::broadcast:
      return check_broadcast(c, mesh, g, comm);
  }
}

INSTANTIATE_TEST_SUITE_P(Mesh, Ccl, ::testing::ValuesIn(make_cases()),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace meshtest::dist::ccl_test
