// Rank 1 fails an ASSERT, then every rank calls all_reduce: rank 1 has left
// the test, so the others wait in the collective. The meshtest harness must end
// the job promptly, non-zero, with a message naming "[rank 1/N]" — never hang.
#include <gtest/gtest.h>

#include "dist/ccl/all_reduce.hpp"
#include "dist/mesh/mesh_device.hpp"

namespace {

using meshtest::Tensor;
using meshtest::dist::MeshDevice;

TEST(RankFailure, RankOneFailsThenAllReduce) {
  const MeshDevice mesh = MeshDevice::line();
  if (mesh.device_id() == 1) {
    ASSERT_TRUE(false) << "rank 1 fails on purpose";
  }
  const Tensor t = Tensor::from_vector<float>({4}, {1.0F, 2.0F, 3.0F, 4.0F});
  const Tensor sum = meshtest::dist::all_reduce(mesh, t);
  EXPECT_EQ(sum.item(0), 1.0 * mesh.size());
}

}  // namespace
