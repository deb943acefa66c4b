// Sharded GPU ops against a single device (dist/testing/gpu_checks.hpp): the shards on each
// rank's GPU, the reference on the CPU or on device 0's GPU, the output gathered and compared as
// for a host op; a wrong GPU op fails once, on device 0, naming the device that owns the worst
// element; the single-device chunked run of a 2x4 configuration on one GPU. The op under test
// doubles its input with gpu::reduce_terms (x + x) and may gather the result over NCCL, so the
// expected values are exact: twice the input (ops::add on the CPU).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "dist/testing/gpu/gpu_test.hpp"
#include "dist/testing/gpu_checks.hpp"
#include "src/core/random.hpp"
#include "src/gpu/reduce.hpp"
#include "src/gpu/runtime.hpp"
#include "src/ops/elementwise.hpp"

namespace meshtest::dist::testing {
namespace {

/// x + x on x's GPU, by the exact reduction kernel.
DeviceTensor twice(const DeviceTensor& x) {
  DeviceTensor y(x.shape(), x.dtype(), Tensor::Uninitialized{});
  const std::array<const std::byte*, 2> terms{x.bytes(), x.bytes()};
  meshtest::gpu::reduce_terms(y.bytes(), terms, x.numel(), x.dtype(), meshtest::gpu::Reduce::sum,
                              nullptr);
  MESHTEST_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  return y;
}

const ReferenceFn kTwiceOnCpu = [](const std::vector<Tensor>& full) {
  return add(full[0], full[0]);
};

/// The line of all ranks as a 1 x p mesh, made once.
const MeshDevice& line() {
  static const MeshDevice mesh = MeshDevice::line();
  return mesh;
}

Placements rows_on_axis_1() { return {Replicate{}, Shard{0}}; }

TEST(GpuSingleDevice, ShardedGpuOpMatchesTheCpuReference) {
  const int p = line().size();
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    const Tensor x = random_normal({2 * p + 3, 5}, t, {.seed = 29});
    const Comparison c = expect_gpu_matches_single_device(
        line(), {{.full = x, .placements = rows_on_axis_1()}}, kTwiceOnCpu,
        [](const MeshDevice&, const std::vector<DeviceTensor>& local) { return twice(local[0]); },
        rows_on_axis_1(), {.metric = Metric::exact, .label = fmt::format("twice {}", t)});
    EXPECT_TRUE(c.passed) << fmt::format("{}", t);
  }
}

TEST(GpuSingleDevice, ReferenceOnOneGpuAndAGatheredOutput) {
  const Tensor x = random_normal({3 * line().size() + 1, 4}, DType::f32, {.seed = 30});
  const Comparison c = expect_gpu_matches_single_device(
      line(), {{.full = x, .placements = rows_on_axis_1()}},
      GpuReferenceFn([](const std::vector<DeviceTensor>& full) { return twice(full[0]); }),
      [](const MeshDevice& mesh, const std::vector<DeviceTensor>& local) {
        return all_gather(mesh, twice(local[0]), {.dim = 0});  // replicated output
      },
      kReplicated, {.metric = Metric::exact, .label = "gathered twice"});
  EXPECT_TRUE(c.passed);
}

TEST(GpuSingleDevice, AWrongGpuOpFailsOnceOnDeviceZeroNamingTheOwner) {
  const int p = line().size(), last = p - 1;
  const Tensor x = random_normal({2 * p, 3}, DType::f32, {.seed = 31});
  ::testing::TestPartResultArray failures;
  Comparison c;
  {
    const ::testing::ScopedFakeTestPartResultReporter fake(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    c = expect_gpu_matches_single_device(
        line(), {{.full = x, .placements = rows_on_axis_1()}}, kTwiceOnCpu,
        [last](const MeshDevice& mesh, const std::vector<DeviceTensor>& local) {
          // The last device forgets to double.
          return mesh.device_id() == last ? DeviceTensor(local[0]) : twice(local[0]);
        },
        rows_on_axis_1(), {.metric = Metric::exact, .label = "last device wrong"});
  }
  EXPECT_FALSE(c.passed);
  ASSERT_EQ(failures.size(), line().device_id() == 0 ? 1 : 0);
  if (line().device_id() == 0) {
    const std::string msg = failures.GetTestPartResult(0).message();
    EXPECT_NE(msg.find("last device wrong"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("device {}", last)), std::string::npos) << msg;
  }
}

TEST(GpuSingleDevice, ChunkedRunOfATwoByFourMeshOnOneGpu) {
  // Rank 0 alone runs device 0's chunk of a 2x4 configuration on its GPU; the others idle.
  if (line().device_id() != 0) return;
  const Placements p{Shard{0}, Shard{1}};
  const std::vector<MeshInput> in{
      {.name = "x", .full = random_normal({6, 8}, DType::f32, {.seed = 32}), .placements = p}};
  const GpuShardedFn on_gpu_twice = [](const MeshDevice& mesh,
                                       const std::vector<DeviceTensor>& local) {
    EXPECT_EQ(mesh.size(), 1);
    EXPECT_EQ(local[0].shape(), Shape({3, 2}));  // rows [0, 3), columns [0, 2) of [6, 8]
    return twice(local[0]);
  };
  EXPECT_TRUE(
      expect_gpu_chunk_matches({2, 4}, in, kTwiceOnCpu, on_gpu_twice, {.metric = Metric::exact})
          .passed);
  const GpuShardedFn wrong = [](const MeshDevice&, const std::vector<DeviceTensor>& local) {
    return DeviceTensor(local[0]);
  };
  Comparison c;
  EXPECT_NONFATAL_FAILURE(
      c = expect_gpu_chunk_matches({2, 4}, in, kTwiceOnCpu, wrong, {.metric = Metric::exact}),
      "device 0's chunk of a 2x4 mesh, run alone, differs");
  EXPECT_FALSE(c.passed);
}

}  // namespace
}  // namespace meshtest::dist::testing
