// Options structs shared by the collectives, and the reduction ops.
#pragma once

#include <string_view>

#include "dist/mesh/mesh_device.hpp"

namespace meshtest::dist {

/// Element-wise reduction of all_reduce and reduce_scatter. avg = sum / n and
/// is defined for floating dtypes only; u8 (packed formats) cannot be reduced.
enum class ReduceOp { sum, max, min, avg };

std::string_view reduce_op_name(ReduceOp op);

/// The arithmetic of a reduction (all_reduce, reduce_scatter) on tensors on a GPU
/// (dist/gpu/ccl/ccl.hpp). On host memory every path has the exact numerics.
enum class Numerics {
  from_env,  ///< MESHTEST_GPU_REDUCE decides: exact (also when unset) or nccl
  exact,     ///< the CPU path's bits: axis order, bf16/f16 accumulated in f32 and rounded once
  nccl,      ///< NCCL's own reductions: its order and roundings (tensors on a GPU only)
};

/// "from_env", "exact" or "nccl".
std::string_view numerics_name(Numerics n);

// Every options struct has `path`: the name of the path that is to move the call's data ("mpi",
// "shm", ...: a test or bench of one path); empty leaves the choice to MESHTEST_CCL_PATH and
// then to the registry's order. Every device must pass the same.

struct AllGatherOptions {
  int dim = 0;                 ///< tensor dim to concatenate along (negative counts from the end)
  int axis = kAllAxes;         ///< mesh axis (0, 1) or kAllAxes
  std::string_view path = {};  ///< the path by name (dist/ccl/path_registry.hpp); empty: any
};

struct ReduceScatterOptions {
  int dim = 0;
  int axis = kAllAxes;
  ReduceOp op = ReduceOp::sum;
  Numerics numerics = Numerics::from_env;  ///< tensors on a GPU: exact or NCCL's arithmetic
  std::string_view path = {};  ///< the path by name (dist/ccl/path_registry.hpp); empty: any
};

struct AllReduceOptions {
  int axis = kAllAxes;
  ReduceOp op = ReduceOp::sum;
  Numerics numerics = Numerics::from_env;  ///< tensors on a GPU: exact or NCCL's arithmetic
  std::string_view path = {};  ///< the path by name (dist/ccl/path_registry.hpp); empty: any
};

struct AllToAllOptions {
  int split_dim = 0;   ///< dim cut into one piece per device (array_split rule)
  int concat_dim = 0;  ///< dim the received pieces are concatenated along, in axis order
  int axis = kAllAxes;
  std::string_view path = {};  ///< the path by name (dist/ccl/path_registry.hpp); empty: any
};

struct BroadcastOptions {
  int root = 0;  ///< index of the root within the axis group
  int axis = kAllAxes;
  std::string_view path = {};  ///< the path by name (dist/ccl/path_registry.hpp); empty: any
};

}  // namespace meshtest::dist
