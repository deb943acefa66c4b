// README.md's "A sharded GPU test in ten lines", verbatim below (docs.readme_tests checks that
// they stay the same): compiled and run with the GPU tests, so the README's example cannot rot.
#include <gtest/gtest.h>

#include "dist/ccl/all_reduce.hpp"
#include "dist/gpu/ccl/ccl.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "src/core/random.hpp"

TEST(AllReduceGpu, ShardsOnEveryGpuSumToTheHostCallsBits) {
  const auto mesh = meshtest::dist::MeshDevice::line();  // one rank per GPU, bound by the main
  const auto full =
      meshtest::random_normal({4 * mesh.size(), 32}, meshtest::DType::f32, {.seed = 7});
  const auto shard = meshtest::split(full, mesh.size(), 0)[mesh.device_id()];  // 4 rows each
  const auto on_gpu = meshtest::gpu::DeviceTensor::from_host(shard);
  const auto summed = meshtest::dist::all_reduce(mesh, on_gpu);  // NCCL, in the CPU path's order
  EXPECT_TRUE(summed.to_host().bitwise_equal(meshtest::dist::all_reduce(mesh, shard)));
}
