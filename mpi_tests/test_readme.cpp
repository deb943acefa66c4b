// README.md's "A sharded test in ten lines", verbatim below (docs.readme_tests checks that they
// stay the same): compiled and run with the MPI tests, so the README's example cannot rot.
#include <gtest/gtest.h>

#include "dist/ccl/all_gather.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "src/core/random.hpp"

TEST(AllGather, ShardsOfDimOneRebuildTheTensor) {
  const auto mesh = meshtest::dist::MeshDevice::line();  // the 1 x n mesh of all ranks
  // Counter-based random: every rank generates the same global tensor.
  const auto full = meshtest::random_normal({6, 10}, meshtest::DType::f32, {.seed = 7});
  const auto shard = meshtest::split(full, mesh.size(), 1)[mesh.device_id()];  // array_split
  const auto gathered = meshtest::dist::all_gather(mesh, shard, {.dim = 1});
  EXPECT_TRUE(gathered.bitwise_equal(full));
}
