// Every version of every kernel family sharded over the mesh, column-parallel (N blocks split,
// outputs gathered) and row-parallel (K blocks split, partial products summed), against the
// same version's single-device run within the error model of the same sums in another order
// (src/check/tolerance.hpp), on every small configuration; and the shards themselves: whole
// blocks, their scales with them, every block on exactly one device.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "dist/kernels/fp8_matmul_parallel.hpp"
#include "dist/kernels/mxfp4_matmul_parallel.hpp"
#include "dist/testing/harness/fixtures.hpp"
#include "src/check/tolerance.hpp"
#include "src/kernels/fp8_matmul.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/mxfp4.hpp"

namespace meshtest::dist::testing {
namespace {

using kernels::Config;
using kernels::Family;
using kernels::Version;

/// n of the error model of one output of a block-quantized matmul: the k products, and per K
/// block the rounding of its partial times its scales and of its accumulation (v2, v3).
std::int64_t matmul_terms(const Config& c) { return c.k + 2 * ((c.k + c.block - 1) / c.block); }

/// Expects the sharded run `got` within the f32 error model of the single-device run of the same
/// version: `terms` per element, each element's magnitude `scale` (Σ |x_k w_k| of the dequantized
/// operands).
void expect_within(const Tensor& single, const Tensor& got, std::int64_t terms, const Tensor& scale,
                   const std::string& what) {
  const ErrorModel m{.dtype = DType::f32, .terms = terms, .reference = Reference::other_order};
  const Comparison c = compare(single, got, m, scale);
  EXPECT_TRUE(c.passed) << what << ": " << c;
}

TEST_F(MeshTest, EveryFp8MatmulVersionColumnAndRowParallelMatchesItsSingleDeviceRun) {
  const Family& f = kernels::family("fp8_matmul");
  const int p = mesh().axis_size(kAllAxes);
  for (const Config& c : f.quick_configs) {
    const kernels::Inputs in = f.make_inputs(c);
    const kernels::Fp8MatmulOperands o = kernels::fp8_matmul_operands(in);
    const Tensor scale = linear(magnitude(dequantize(o.x)), magnitude(dequantize(o.w)));
    for (const Version& v : f.versions) {
      const Tensor single = v.run(in);
      // Each output column is computed on one device from the same operands: only the GEMM's
      // blocking (which depends on the shape) may order the sums differently.
      expect_within(single, fp8_matmul_column_parallel(mesh(), kAllAxes, v, in), matmul_terms(c),
                    scale, v.name + " column-parallel on " + c.name);
      // Partial products summed by all_reduce over p: the K blocks' sums in another order.
      expect_within(single, fp8_matmul_row_parallel(mesh(), kAllAxes, v, in), matmul_terms(c) + p,
                    scale, v.name + " row-parallel on " + c.name);
    }
  }
}

TEST_F(MeshTest, EveryMxfp4MatmulVersionColumnAndRowParallelMatchesItsSingleDeviceRun) {
  const Family& f = kernels::family("mxfp4_matmul");
  const int p = mesh().axis_size(kAllAxes);
  for (const Config& c : f.quick_configs) {
    const kernels::Inputs in = f.make_inputs(c);
    const Tensor scale = linear(magnitude(in.tensors[0]),
                                magnitude(mxfp4_decode(in.tensors[1], in.tensors[2], DType::f64)));
    for (const Version& v : f.versions) {
      const Tensor single = v.run(in);
      expect_within(single, mxfp4_matmul_column_parallel(mesh(), kAllAxes, v, in), matmul_terms(c),
                    scale, v.name + " column-parallel on " + c.name);
      expect_within(single, mxfp4_matmul_row_parallel(mesh(), kAllAxes, v, in), matmul_terms(c) + p,
                    scale, v.name + " row-parallel on " + c.name);
    }
  }
}

TEST_F(MeshTest, Mxfp4ShardsCoverEveryRowAndBlockOnce) {
  const Family& f = kernels::family("mxfp4_matmul");
  const int p = mesh().axis_size(kAllAxes);
  for (const Config& c : f.quick_configs) {
    const kernels::Inputs in = f.make_inputs(c);
    std::int64_t rows = 0, cols = 0;
    for (int i = 0; i < p; ++i) {
      const kernels::Inputs col = mxfp4_matmul_column_shard(in, p, i);
      EXPECT_TRUE(col.tensors[1].bitwise_equal(in.tensors[1].slice(0, rows, col.config.n)));
      EXPECT_TRUE(col.tensors[2].bitwise_equal(in.tensors[2].slice(0, rows, col.config.n)));
      rows += col.config.n;
      const kernels::Inputs row = mxfp4_matmul_row_shard(in, p, i);
      EXPECT_EQ(row.tensors[0].shape()[1], row.tensors[1].shape()[1] * 32);
      EXPECT_TRUE(row.tensors[0].bitwise_equal(in.tensors[0].slice(1, cols, row.config.k)));
      cols += row.config.k;
    }
    EXPECT_EQ(rows, c.n) << c.name;
    EXPECT_EQ(cols, c.k) << c.name;
  }
}

TEST_F(MeshTest, ShardsAreWholeBlocksWithTheirScalesAndCoverEveryBlockOnce) {
  const Family& f = kernels::family("fp8_matmul");
  const int p = mesh().axis_size(kAllAxes);
  for (const Config& c : f.quick_configs) {
    const kernels::Inputs in = f.make_inputs(c);
    const std::int64_t nb = (c.n + c.block - 1) / c.block, kb = (c.k + c.block - 1) / c.block;
    std::int64_t rows = 0, row_blocks = 0, cols = 0, col_blocks = 0;
    for (int i = 0; i < p; ++i) {
      const kernels::Inputs col = fp8_matmul_column_shard(in, p, i);
      EXPECT_EQ(col.tensors[2].shape()[0], col.config.n);
      EXPECT_EQ(col.tensors[3].shape()[0], (col.config.n + c.block - 1) / c.block);
      EXPECT_TRUE(col.tensors[2].bitwise_equal(
          in.tensors[2].slice(0, std::min(c.n, row_blocks * c.block), col.config.n)))
          << c.name << " device " << i;
      rows += col.config.n;
      row_blocks += col.tensors[3].shape()[0];
      const kernels::Inputs row = fp8_matmul_row_shard(in, p, i);
      EXPECT_EQ(row.tensors[0].shape()[1], row.config.k);
      EXPECT_EQ(row.tensors[1].shape()[1], row.tensors[3].shape()[1]);
      EXPECT_TRUE(row.tensors[1].bitwise_equal(
          in.tensors[1].slice(1, col_blocks, row.tensors[1].shape()[1])));
      cols += row.config.k;
      col_blocks += row.tensors[1].shape()[1];
    }
    EXPECT_EQ(rows, c.n) << c.name;
    EXPECT_EQ(row_blocks, nb) << c.name;
    EXPECT_EQ(cols, c.k) << c.name;
    EXPECT_EQ(col_blocks, kb) << c.name;
  }
}

}  // namespace
}  // namespace meshtest::dist::testing
