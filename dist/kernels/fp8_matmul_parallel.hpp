// The fp8 block-quantized matmul sharded over a mesh axis, for any version of its family.
//   column-parallel: w's N blocks (rows of wq in b-row blocks, rows of ws) split over the axis
//                    by the array_split rule on the ceil(n / b) blocks, x whole on every
//                    device; each device runs the version on its blocks and the outputs are
//                    all_gathered along N.
//   row-parallel:    the K blocks (columns of xq and wq in b-column blocks, columns of xs and
//                    ws) split the same way; each device's partial product [m, n] is summed
//                    by all_reduce.
// Splitting whole blocks keeps every scale with its codes, so no split ever falls inside a
// block; a device given no block (more devices than blocks) computes an empty piece or a zero
// partial product. Every device of the axis must call with the same inputs.
#pragma once

#include "dist/mesh/mesh_device.hpp"
#include "src/kernels/family.hpp"

namespace meshtest::dist {

Tensor fp8_matmul_column_parallel(const MeshDevice& mesh, int axis, const kernels::Version& v,
                                  const kernels::Inputs& in);
Tensor fp8_matmul_row_parallel(const MeshDevice& mesh, int axis, const kernels::Version& v,
                               const kernels::Inputs& in);

/// This device's part of `in` for each layout (the blocks it holds).
kernels::Inputs fp8_matmul_column_shard(const kernels::Inputs& in, int parts, int index);
kernels::Inputs fp8_matmul_row_shard(const kernels::Inputs& in, int parts, int index);

}  // namespace meshtest::dist
