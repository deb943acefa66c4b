// CCL cases of the demo: an op on a mesh axis, its deterministic inputs, the run and the reference.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Columns of every per-device input: inputs are [rows, kCols].
inline constexpr std::int64_t kCols = 16;

enum class Op {
  all_gather,
  reduce_scatter,
  all_reduce_sum,
  all_reduce_avg,
  all_to_all,
  all_to_all_v,
  broadcast
};
inline constexpr std::array kOps = {Op::all_gather,     Op::reduce_scatter, Op::all_reduce_sum,
                                    Op::all_reduce_avg, Op::all_to_all,     Op::all_to_all_v,
                                    Op::broadcast};

/// "all_gather", "all_reduce(sum)", ...
const char* op_name(Op op);

/// One row of the demo: an op on a mesh axis (0, 1 or kAllAxes) for a dtype, with `rows` rows
/// of kCols per device (all_to_all_v: uneven rows, see send_counts).
///   all_gather      dim 0             reduce_scatter  dim 0, sum
///   all_to_all      split 0, concat 1 all_to_all_v    split 0, concat 0, uneven counts
///   broadcast       root 0            all_reduce      sum or avg
struct Case {
  const MeshDevice* mesh = nullptr;
  Op op = Op::all_gather;
  int axis = kAllAxes;
  DType dtype = DType::f32;
  std::int64_t rows = 1;
};

/// all_to_all_v: rows device d sends to each axis index (uneven, different on every device).
std::vector<std::int64_t> send_counts(const Case& cs, int d);

/// The global input: every device's rows stacked in device order, [sum_d rows_d, kCols].
Shape global_shape(const Case& cs);

/// Device d's input: its rows of the global tensor, whose element g is the small integer
/// ((37 g + 5) mod 23) - 11 (times the axis size for avg, so the mean is exact). Any device can
/// make any device's input; local.
Tensor device_input(const Case& cs, int d);

/// The op on the mesh; collective over the devices of cs.axis. x: this device's input.
Tensor run(const Case& cs, const Tensor& x);

/// The same op done on one device from the inputs of this device's group; local. Equals run()'s
/// result on this device.
Tensor reference(const Case& cs);

}  // namespace meshtest::dist
