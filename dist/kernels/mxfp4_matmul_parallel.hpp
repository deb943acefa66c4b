// The MXFP4 expert matmul sharded over a mesh axis, for any version of its family.
//   column-parallel: w's rows (with their scales) split over the axis by the array_split rule
//                    (any row boundary is a block boundary: MXFP4 blocks run along k), x whole
//                    on every device, outputs all_gathered along N.
//   row-parallel:    w's blocks of 32 along k (blocks and scales) and the matching columns of
//                    x split by the array_split rule on the blocks; partial products summed by
//                    all_reduce.
// Every device of the axis must call with the same inputs.
#pragma once

#include "dist/mesh/mesh_device.hpp"
#include "src/kernels/family.hpp"

namespace meshtest::dist {

Tensor mxfp4_matmul_column_parallel(const MeshDevice& mesh, int axis, const kernels::Version& v,
                                    const kernels::Inputs& in);
Tensor mxfp4_matmul_row_parallel(const MeshDevice& mesh, int axis, const kernels::Version& v,
                                 const kernels::Inputs& in);

/// This device's part of `in` (tensors {x, blocks, scales}) for each layout.
kernels::Inputs mxfp4_matmul_column_shard(const kernels::Inputs& in, int parts, int index);
kernels::Inputs mxfp4_matmul_row_shard(const kernels::Inputs& in, int parts, int index);

}  // namespace meshtest::dist
