// Inputs and checks shared by the MPI tests of collectives on GPU ranks: every mesh shape of the
// world with each axis, terms whose sums show another order of additions in their bits, the
// bitwise check against the CPU path and the check of NCCL's numerics against it.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dist/ccl/all_reduce.hpp"
#include "dist/ccl/options.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "src/check/compare.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist::gpu {

/// The mesh of rows x cols devices over the world, made once (collectively, in the same order
/// on every rank) and kept for the process.
inline const MeshDevice& mesh_of(int rows, int cols) {
  static std::map<std::pair<int, int>, MeshDevice> meshes;
  return meshes.try_emplace({rows, cols}, std::vector<int>{rows, cols}).first->second;
}

/// Calls f(mesh, axis) for every mesh shape of the world (rows dividing the world size) and
/// every axis (kAllAxes, 0, 1), with the pair in gtest's trace.
inline void for_each_mesh_axis(const std::function<void(const MeshDevice&, int)>& f) {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  for (int rows = 1; rows <= n; ++rows) {
    if (n % rows != 0) continue;
    const MeshDevice& mesh = mesh_of(rows, n / rows);
    for (int axis : {kAllAxes, 0, 1}) {
      SCOPED_TRACE(fmt::format("mesh {} axis {}", mesh.str(), axis));
      f(mesh, axis);
    }
  }
}

/// Device `device`'s term: normal values spread over 2^0..2^8, so that another order of
/// additions or another rounding shows in the bits; integer dtypes get whole, small values.
inline Tensor term(const Shape& s, DType t, int device, int salt = 0) {
  const Tensor x = random_normal(s, DType::f32,
                                 {.seed = 28u + static_cast<std::uint64_t>(salt),
                                  .stream = static_cast<std::uint64_t>(device)});
  std::vector<float> v(x.span<float>().begin(), x.span<float>().end());
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] *= static_cast<float>(1 << (i % 9));
    if (!is_floating(t)) v[i] = std::round(v[i] * 16);
  }
  return Tensor::from_vector(s, v).astype(t);
}

/// Expects got to hold want's dtype, shape and bits; the worst element otherwise.
inline void expect_bits(const Tensor& want, const Tensor& got, const std::string& what) {
  const bool same = got.bitwise_equal(want);
  EXPECT_TRUE(same)
      << what << ": "
      << (got.shape() == want.shape() && got.dtype() == want.dtype()
              ? compare(want.astype(DType::f64), got.astype(DType::f64), Metric::exact, 0).str()
              : fmt::format("got {}{}, want {}{}", got.dtype(), got.shape(), want.dtype(),
                            want.shape()));
}

/// The magnitude of each element's terms over the axis group (the CPU path's all_reduce of |x|
/// in f64, divided by p for avg): the scale of the error model of a reduction in another order.
inline Tensor magnitudes(const MeshDevice& mesh, int axis, const Tensor& x, bool avg) {
  Tensor m = x.astype(DType::f64);
  const double p = mesh.axis_size(axis);
  for (double& v : m.span<double>()) v = std::abs(v) / (avg ? p : 1);
  return dist::all_reduce(mesh, m, {.axis = axis});
}

/// NCCL's all_reduce and reduce_scatter (this device's block along the dim) of x with op.
using NcclReductions = std::function<std::pair<Tensor, Tensor>(const Tensor& x, ReduceOp op)>;

/// Checks NCCL's numerics on the group of `axis` against the CPU path, on inputs of shape s
/// whose blocks along `dim` are array_split over the group: integer sums and max equal the CPU
/// path's bits (any order gives them); float sums and averages, another order of p terms rounded
/// after each step for bf16 and f16 (avg scaling each term first), stay within the error model of
/// p terms (2p for avg) and, for bf16 and f16, p roundings.
inline void expect_nccl_numerics(const MeshDevice& mesh, int axis, const Shape& s, int dim,
                                 const NcclReductions& on_nccl) {
  const int p = mesh.axis_size(axis);
  const Range own = split_range(s[dim], p, mesh.axis_index(axis));
  for (const auto& [t, op] :
       {std::pair(DType::i32, ReduceOp::sum), std::pair(DType::f32, ReduceOp::max),
        std::pair(DType::bf16, ReduceOp::max), std::pair(DType::f16, ReduceOp::max)}) {
    const std::string what = fmt::format("{}{} {} on NCCL, dim {}", t, s, reduce_op_name(op), dim);
    const Tensor x = term(s, t, mesh.device_id());
    const Tensor want = dist::all_reduce(mesh, x, {.axis = axis, .op = op});
    const auto [ar, rs] = on_nccl(x, op);
    expect_bits(want, ar, "all_reduce " + what);
    expect_bits(want.slice(dim, own), rs, "reduce_scatter " + what);
  }
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      const Tensor x = term(s, t, mesh.device_id(), 1);
      const Tensor want = dist::all_reduce(mesh, x, {.axis = axis, .op = op});
      const Tensor scale = magnitudes(mesh, axis, x, op == ReduceOp::avg);
      const ErrorModel model{.dtype = t,
                             .terms = op == ReduceOp::avg ? 2 * p : p,
                             .roundings = widens_to_f32(t) ? p : 0};
      const auto [ar, rs] = on_nccl(x, op);
      const Comparison c_ar = compare(want, ar, model, scale);
      EXPECT_TRUE(c_ar.passed) << fmt::format("all_reduce {} {}: {}", s, model.str(), c_ar.str());
      const Comparison c_rs = compare(want.slice(dim, own), rs, model, scale.slice(dim, own));
      EXPECT_TRUE(c_rs.passed) << fmt::format("reduce_scatter {} dim {} {}: {}", s, dim,
                                              model.str(), c_rs.str());
    }
  }
}

}  // namespace meshtest::dist::gpu
