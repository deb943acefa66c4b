// Column- and row-parallel fp8 block-quantized matmul.
#include "dist/kernels/fp8_matmul_parallel.hpp"

#include <algorithm>

#include "dist/kernels/parallel.hpp"
#include "src/kernels/fp8_matmul.hpp"

namespace meshtest::dist {

namespace {

/// Blocks [first, first + count) of `blocks` blocks of `b` elements over a dim of `n`: the
/// element range they cover (the last block may be ragged).
Range elements_of(Range blocks, std::int64_t b, std::int64_t n) {
  const std::int64_t begin = std::min(n, blocks.start * b);
  const std::int64_t end = std::min(n, (blocks.start + blocks.size) * b);
  return {begin, end - begin};
}

}  // namespace

kernels::Inputs fp8_matmul_column_shard(const kernels::Inputs& in, int parts, int index) {
  const auto o = kernels::fp8_matmul_operands(in);
  const Range blocks = split_range(o.w.scales.shape()[0], parts, index);
  const Range rows = elements_of(blocks, o.dims.block, o.dims.n);
  kernels::Inputs local{.config = in.config, .tensors = in.tensors};
  local.config.n = rows.size;
  local.tensors[2] = in.tensors[2].slice(0, rows);
  local.tensors[3] = in.tensors[3].slice(0, blocks);
  return local;
}

kernels::Inputs fp8_matmul_row_shard(const kernels::Inputs& in, int parts, int index) {
  const auto o = kernels::fp8_matmul_operands(in);
  const Range blocks = split_range(o.dims.k_blocks, parts, index);
  const Range cols = elements_of(blocks, o.dims.block, o.dims.k);
  kernels::Inputs local{.config = in.config, .tensors = {}};
  local.config.k = cols.size;
  for (int t : {0, 2}) {
    local.tensors.push_back(in.tensors[static_cast<std::size_t>(t)].slice(1, cols));
    local.tensors.push_back(in.tensors[static_cast<std::size_t>(t) + 1].slice(1, blocks));
  }
  return local;
}

Tensor fp8_matmul_column_parallel(const MeshDevice& mesh, int axis, const kernels::Version& v,
                                  const kernels::Inputs& in) {
  return gather_columns(mesh, axis, v, in, fp8_matmul_column_shard);
}

Tensor fp8_matmul_row_parallel(const MeshDevice& mesh, int axis, const kernels::Version& v,
                               const kernels::Inputs& in) {
  return sum_partials(mesh, axis, v, in, fp8_matmul_row_shard);
}

}  // namespace meshtest::dist
