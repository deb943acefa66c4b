// MPI test helper for test_ccl: the cases (every mesh shape that fits np x axis x dim x dtype x
// reduce op; above 8 ranks the lines and squarest shapes, one dtype per mesh shape and axis, in
// turn: support/scale.hpp) as calls
// of dist/ccl/cases.hpp's table (which makes the inputs and the expected outputs), the groups,
// bitwise checks and the maps of the direct MPI calls.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dist/ccl/cases.hpp"
#include "dist/ccl/ccl.hpp"
#include "dist/ccl/mpi_types.hpp"
#include "mpi_tests/support/scale.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist::ccl_test {

/// One test case: the op and its options on one mesh shape. `dim` is the dim of all_gather
/// and reduce_scatter, all_to_all's split_dim, broadcast's root (0 or -1 = the last device).
struct Case {
  CclOp op;
  int rows = 1, cols = 1, axis = kAllAxes;
  DType dtype = DType::f32;
  int dim = 0, concat_dim = 0;
  ReduceOp rop = ReduceOp::sum;
};

inline std::string case_name(const Case& c) {
  auto d = [](int v) { return v < 0 ? fmt::format("m{}", -v) : std::to_string(v); };
  const std::string rop(reduce_op_name(c.rop));
  const std::string opts = c.op == CclOp::all_gather       ? "dim" + d(c.dim)
                           : c.op == CclOp::reduce_scatter ? rop + "_dim" + d(c.dim)
                           : c.op == CclOp::all_reduce     ? rop
                           : c.op == CclOp::broadcast
                               ? (c.dim == 0 ? "root0" : "rootlast")
                               : fmt::format("split{}_concat{}", d(c.dim), d(c.concat_dim));
  return fmt::format("{}_{}_axis{}_{}_mesh{}x{}", ccl_case(c.op).name, opts,
                     c.axis == kAllAxes ? "all" : std::to_string(c.axis), c.dtype, c.rows, c.cols);
}
inline void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

// Cases are made when gtest registers them, after MPI_Init in the test main; the launcher's
// environment is the fallback.
inline int world_size_for_cases() {
  int init = 0;
  MPI_Initialized(&init);
  int n = 0;
  if (init) MPI_Comm_size(MPI_COMM_WORLD, &n);
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (n <= 0 && std::getenv(var) != nullptr) n = std::atoi(std::getenv(var));
  }
  return std::max(n, 1);
}

inline std::vector<Case> make_cases() {
  const int n = world_size_for_cases();
  constexpr int kDims[] = {0, 1, 2, -1};
  constexpr std::pair<int, int> kA2a[] = {{0, 0}, {0, 1}, {1, 0}, {2, 2}, {-1, 1}};
  constexpr std::pair<int, int> kA2av[] = {{0, 0}, {-1, -1}, {0, 2}};
  std::vector<std::array<int, 2>> shapes;
  for (int rows = 1; rows <= n; ++rows) {
    if (n % rows == 0) shapes.push_back({rows, n / rows});
  }
  std::vector<Case> out;
  std::size_t salt = 0;  // above 8 ranks each (mesh shape, axis) takes one dtype, in turn
  // Above 8 ranks the lines and the squarest shapes (support/scale.hpp): at 32 ranks 4 of the 6,
  // with 12 (shape, axis) pairs for the 7 dtypes.
  for (const auto [rows, cols] : test_support::mesh_shapes_at_scale(shapes)) {
    for (int axis : {0, 1, kAllAxes}) {
      for (DType t :
           test_support::sample_at_scale(std::span<const DType>(kAllDTypes), n, 1, salt++)) {
        const Case base{
            .op = CclOp::all_gather, .rows = rows, .cols = cols, .axis = axis, .dtype = t};
        auto add = [&](CclOp op, int dim, int concat_dim = 0, ReduceOp rop = ReduceOp::sum) {
          Case c = base;
          c.op = op, c.dim = dim, c.concat_dim = concat_dim, c.rop = rop;
          out.push_back(c);
        };
        for (int d : kDims) add(CclOp::all_gather, d);
        for (auto [s, c] : kA2a) add(CclOp::all_to_all, s, c);
        for (auto [s, c] : kA2av) add(CclOp::all_to_all_v, s, c);
        for (int root : {0, -1}) add(CclOp::broadcast, root);
        if (t == DType::u8) continue;  // no reductions on u8 (see test_ccl_bad_input)
        for (ReduceOp r : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg}) {
          if (r == ReduceOp::avg && !is_floating(t)) continue;
          add(CclOp::all_reduce, 0, 0, r);
          for (int d : kDims) {
            if (r == ReduceOp::sum || d == 0 || d == -1) add(CclOp::reduce_scatter, d, 0, r);
          }
        }
      }
    }
  }
  return out;
}

// ---- groups, and the cases as calls of the table ------------------------------------------

inline const Shape kBase{2, 3, 2};  // the tested dim is overridden per case

/// The device ids of this device's group along `axis`, in axis order (DESIGN: Mesh).
struct Group {
  std::vector<int> devices;
  int index = 0;
  int p() const { return static_cast<int>(devices.size()); }
};

inline Group group_of(const MeshDevice& mesh, int axis) {
  Group g{.devices = axis_group(mesh, axis, mesh.device_id())};
  g.index = static_cast<int>(std::ranges::find(g.devices, mesh.device_id()) - g.devices.begin());
  return g;
}

/// Case c on group g as a call of the table, every device's input of `shape` (the caller sets
/// sizes or counts where they differ).
inline CclCall call_of(const Case& c, const Group& g, const Shape& shape) {
  const bool broadcast = c.op == CclOp::broadcast;
  return {.op = c.op,
          .dtype = c.dtype,
          .reduce = c.rop,
          .axis = c.axis,
          .devices = g.devices,
          .shape = shape,
          .dim = broadcast ? 0 : c.dim,
          .concat_dim = c.concat_dim,
          .root = !broadcast || c.dim == 0 ? 0 : g.p() - 1};
}

/// Sizes along the tested dim: even, then the uneven array_split cases, then empty.
inline std::vector<std::int64_t> sizes_for(int p) { return {2 * p, p + 1, 2 * p - 1, 1, 0}; }

// ---- check helpers: meshes, bitwise comparison, the direct MPI calls -------------------------

inline const MeshDevice& mesh_of(int rows, int cols) {
  static std::map<std::pair<int, int>, MeshDevice> meshes;  // collective creation, same order
  return meshes.try_emplace({rows, cols}, std::vector<int>{rows, cols}).first->second;
}

inline std::string show(const Tensor& t) {
  std::vector<double> v;
  for (std::int64_t i = 0; i < std::min<std::int64_t>(t.numel(), 24); ++i) v.push_back(t.item(i));
  return fmt::format("{} {{{}{}}}", describe(t), fmt::join(v, ", "), t.numel() > 24 ? ", ..." : "");
}

inline void expect_bitwise(const Tensor& got, const Tensor& want, std::string_view against) {
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

inline MPI_Datatype mpi_type(DType t) {  // the test's own map, for the direct MPI calls
  return t == DType::f32   ? MPI_FLOAT
         : t == DType::f64 ? MPI_DOUBLE
         : t == DType::i32 ? MPI_INT32_T
                           : MPI_INT64_T;
}
inline MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::max ? MPI_MAX : op == ReduceOp::min ? MPI_MIN : MPI_SUM;
}
inline bool mpi_can_reduce(const Case& c) {
  return !widens_to_f32(c.dtype) && c.rop != ReduceOp::avg;
}

inline std::vector<int> byte_counts(const std::vector<Tensor>& parts, std::vector<int>* displs) {
  std::vector<int> counts;
  int at = 0;
  for (const Tensor& t : parts) {
    counts.push_back(static_cast<int>(t.nbytes()));
    if (displs != nullptr) displs->push_back(at);
    at += counts.back();
  }
  return counts;
}

}  // namespace meshtest::dist::ccl_test
