// Column- and row-parallel MXFP4 expert matmul.
#include "dist/kernels/mxfp4_matmul_parallel.hpp"

#include "dist/kernels/parallel.hpp"
#include "src/core/error.hpp"
#include "src/ops/mxfp4.hpp"

namespace meshtest::dist {

namespace {

void check_operands(const kernels::Inputs& in) {
  MESHTEST_CHECK(in.tensors.size() == 3 && in.tensors[1].rank() == 3,
                 "mxfp4_matmul: operands {{x [t, k], blocks [n, k / 32, 16], scales [n, k / 32]}} "
                 "expected");
}

}  // namespace

kernels::Inputs mxfp4_matmul_column_shard(const kernels::Inputs& in, int parts, int index) {
  check_operands(in);
  const Range rows = split_range(in.tensors[1].shape()[0], parts, index);
  kernels::Inputs local{.config = in.config, .tensors = in.tensors};
  local.config.n = rows.size;
  local.tensors[1] = in.tensors[1].slice(0, rows);
  local.tensors[2] = in.tensors[2].slice(0, rows);
  return local;
}

kernels::Inputs mxfp4_matmul_row_shard(const kernels::Inputs& in, int parts, int index) {
  check_operands(in);
  const Range blocks = split_range(in.tensors[1].shape()[1], parts, index);
  kernels::Inputs local{.config = in.config, .tensors = {}};
  local.config.k = blocks.size * kMxfp4BlockValues;
  local.tensors = {in.tensors[0].slice(1, blocks.start * kMxfp4BlockValues, local.config.k),
                   in.tensors[1].slice(1, blocks), in.tensors[2].slice(1, blocks)};
  return local;
}

Tensor mxfp4_matmul_column_parallel(const MeshDevice& mesh, int axis, const kernels::Version& v,
                                    const kernels::Inputs& in) {
  return gather_columns(mesh, axis, v, in, mxfp4_matmul_column_shard);
}

Tensor mxfp4_matmul_row_parallel(const MeshDevice& mesh, int axis, const kernels::Version& v,
                                 const kernels::Inputs& in) {
  return sum_partials(mesh, axis, v, in, mxfp4_matmul_row_shard);
}

}  // namespace meshtest::dist
