// The table of collective cases (nccl-tests' testColl): per CCL its names, bus factor, input
// maker, exact expected output and meshtest's run; test_ccl, meshtest-demo and meshtest-bench
// ccl check and time the same calls through it.
//
// Inputs: element k (row-major) of device d's input is ((37 d + 11 k + 5) mod 17) - 8 (u8:
// without the - 8), small integers that every dtype holds exactly. Any sum of up to 32 of them
// stays within +-256, so it is exact in every dtype, bf16 included, in any order and whatever
// the intermediate roundings. Along a mesh axis whose device ids are spaced by a stride 17 does
// not divide, 17 consecutive devices cancel: a sum over the whole group stays within +-36 at any
// p, exact when accumulated as every meshtest path does (dist/ccl/reduce.hpp). max and min are
// exact; avg is that sum divided once and rounded to the dtype, as every path does. On such an
// axis a p that 17 divides sums every element to 0, and max and min over 17 devices or more are
// 8 and -8 everywhere. Expected outputs come from these closed forms in O(output size), never by
// reducing p inputs, so checking a 1 GiB call costs about as much as making its input.
//
// The data half (CclCall, input, expected) is plain parameters and host tensors, so another
// path (NCCL on device tensors) runs the same calls, copies inputs in and outputs out, and
// checks them alike; only `run` is meshtest's own path.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "dist/ccl/options.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "src/core/shape.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// The collectives of the table, in its order.
enum class CclOp { all_gather, reduce_scatter, all_reduce, all_to_all, all_to_all_v, broadcast };

/// One call of a collective as the p devices of one group make it. Device j (axis index j)
/// has the input `shape`, except along `dim` where `sizes` or `counts` say otherwise.
struct CclCall {
  CclOp op = CclOp::all_reduce;
  DType dtype = DType::f32;
  ReduceOp reduce = ReduceOp::sum;  ///< all_reduce, reduce_scatter
  int axis = kAllAxes;              ///< the mesh axis `run` passes to the CCL
  std::vector<int> devices = {};    ///< the group's device ids in axis order; they key the inputs
  Shape shape = {};                 ///< every device's input shape (see sizes, counts)
  int dim = 0;                      ///< all_gather, reduce_scatter: dim; all_to_all(_v): split_dim
  int concat_dim = 0;               ///< all_to_all(_v)
  int root = 0;                     ///< broadcast: the root's axis index
  /// all_gather, all_to_all: device j's size along dim (empty: shape[dim] on every device).
  std::vector<std::int64_t> sizes = {};
  /// all_to_all_v: counts[i * p + j] = the entries along split_dim device i sends device j.
  std::vector<std::int64_t> counts = {};

  int p() const { return static_cast<int>(devices.size()); }
};

/// One row of the table. input and expected are local and deterministic (any device can make
/// any device's); run is collective over the devices of c.axis.
struct CclCase {
  CclOp op;
  std::string_view name;        ///< the CCL's function name: "all_reduce", ...
  std::string_view mpi_name;    ///< the MPI call of the same result on equal contiguous blocks
  double (*bus_factor)(int p);  ///< the CCL's own (dist::<ccl>_bw::bus_factor)
  int ring_passes;              ///< passes over the p devices of a ring algorithm (all_reduce: 2)
  /// Device j's input (axis index j), made from the closed form above.
  Tensor (*input)(const CclCall& c, int j);
  /// The exact output of device i (axis index i): bit for bit what every correct path gives.
  Tensor (*expected)(const CclCall& c, int i);
  /// meshtest's CCL on this device's input x (the device's axis index picks its counts).
  Tensor (*run)(const MeshDevice& mesh, const Tensor& x, const CclCall& c);
};

/// The table, in the order of CclOp.
std::span<const CclCase> ccl_cases();
/// The row of `op`.
const CclCase& ccl_case(CclOp op);

/// A tensor of `shape` holding device `device`'s input values (element k as above); local.
Tensor case_values(int device, const Shape& shape, DType t);

/// all_to_all(_v): the range along split_dim of device `from`'s input that goes to `to`.
Range exchange_range(const CclCall& c, int from, int to);

/// The device ids of `device`'s group along `axis` (0, 1 or kAllAxes), in axis order; local.
std::vector<int> axis_group(const MeshDevice& mesh, int axis, int device);

/// Elements of `got` whose bits differ from `want`'s; max(1, got.numel()) when the shapes or
/// dtypes differ.
std::int64_t count_wrong(const Tensor& got, const Tensor& want);

}  // namespace meshtest::dist
