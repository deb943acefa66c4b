// gather_columns and sum_partials.
#include "dist/kernels/parallel.hpp"

#include "dist/ccl/all_gather.hpp"
#include "dist/ccl/all_reduce.hpp"

namespace meshtest::dist {

Tensor gather_columns(const MeshDevice& mesh, int axis, const kernels::Version& v,
                      const kernels::Inputs& in, ShardFn shard) {
  const kernels::Inputs local = shard(in, mesh.axis_size(axis), mesh.axis_index(axis));
  return all_gather(mesh, v.run(local), {.dim = 1, .axis = axis});
}

Tensor sum_partials(const MeshDevice& mesh, int axis, const kernels::Version& v,
                    const kernels::Inputs& in, ShardFn shard) {
  const kernels::Inputs local = shard(in, mesh.axis_size(axis), mesh.axis_index(axis));
  return all_reduce(mesh, v.run(local), {.axis = axis, .op = ReduceOp::sum});
}

}  // namespace meshtest::dist
