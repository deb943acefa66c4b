// The CCL log's record of an op (shape, dims, axis) and the bus bandwidth factors of the CCLs.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "dist/ccl/ccl.hpp"
#include "dist/ccl/ccl_log.hpp"
#include "mpi_tests/support/ccl_cases.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist::ccl_test {
namespace {

TEST(CclLog, RecordsOpShapeDimsAndAxis) {
  const MeshDevice& mesh = mesh_of(1, world_size_for_cases());
  const Tensor x = case_values(mesh.device_id(), Shape{2, 3, 2}, DType::f32);
  all_gather(mesh, x, {.dim = 1, .axis = 1});
  const CollectiveEntry e = ccl_log_last();
  EXPECT_EQ(e.op, "all_gather");
  EXPECT_EQ(e.detail, "f32[2, 3, 2] dim 1 axis 1");
  EXPECT_TRUE(e.completed);
  all_to_all(mesh, x, {.split_dim = 1, .concat_dim = -1});
  EXPECT_EQ(ccl_log_last().detail, "f32[2, 3, 2] split_dim 1 concat_dim -1 axis all");
}

TEST(CclBusFactor, FollowsNcclTests) {
  for (int n : {1, 2, 3, 8}) {
    SCOPED_TRACE(fmt::format("n = {}", n));
    EXPECT_DOUBLE_EQ(all_reduce_bw::bus_factor(n), 2.0 * (n - 1) / n);
    EXPECT_DOUBLE_EQ(all_gather_bw::bus_factor(n), (n - 1.0) / n);
    EXPECT_DOUBLE_EQ(reduce_scatter_bw::bus_factor(n), (n - 1.0) / n);
    EXPECT_DOUBLE_EQ(all_to_all_bw::bus_factor(n), (n - 1.0) / n);
    EXPECT_DOUBLE_EQ(broadcast_bw::bus_factor(n), 1.0);
  }
  EXPECT_THROW(all_reduce_bw::bus_factor(0), Error);
}

}  // namespace
}  // namespace meshtest::dist::ccl_test
