// The two ways a kernel family's version runs sharded over a mesh axis, given the family's
// rule for cutting its inputs: gather the output columns, or sum the partial products.
#pragma once

#include "dist/mesh/mesh_device.hpp"
#include "src/kernels/family.hpp"

namespace meshtest::dist {

/// This device's part of a family's inputs: part `index` of `parts`.
using ShardFn = kernels::Inputs (*)(const kernels::Inputs& in, int parts, int index);

/// Runs v on this device's shard of `in` and all_gathers the outputs along dim 1 (N).
Tensor gather_columns(const MeshDevice& mesh, int axis, const kernels::Version& v,
                      const kernels::Inputs& in, ShardFn shard);
/// Runs v on this device's shard of `in` and sums the partial products by all_reduce.
Tensor sum_partials(const MeshDevice& mesh, int axis, const kernels::Version& v,
                    const kernels::Inputs& in, ShardFn shard);

}  // namespace meshtest::dist
