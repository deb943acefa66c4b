// Options structs shared by the collectives, and the reduction ops.
#pragma once

#include <string_view>

#include "dist/mesh/mesh_device.hpp"

namespace meshtest::dist {

/// Element-wise reduction of all_reduce and reduce_scatter. avg = sum / n and
/// is defined for floating dtypes only; u8 (packed formats) cannot be reduced.
enum class ReduceOp { sum, max, min, avg };

std::string_view reduce_op_name(ReduceOp op);

struct AllGatherOptions {
  int dim = 0;          ///< tensor dim to concatenate along (negative counts from the end)
  int axis = kAllAxes;  ///< mesh axis (0, 1) or kAllAxes
};

struct ReduceScatterOptions {
  int dim = 0;
  int axis = kAllAxes;
  ReduceOp op = ReduceOp::sum;
};

struct AllReduceOptions {
  int axis = kAllAxes;
  ReduceOp op = ReduceOp::sum;
};

struct AllToAllOptions {
  int split_dim = 0;   ///< dim cut into one piece per device (array_split rule)
  int concat_dim = 0;  ///< dim the received pieces are concatenated along, in axis order
  int axis = kAllAxes;
};

struct BroadcastOptions {
  int root = 0;  ///< index of the root within the axis group
  int axis = kAllAxes;
};

}  // namespace meshtest::dist
