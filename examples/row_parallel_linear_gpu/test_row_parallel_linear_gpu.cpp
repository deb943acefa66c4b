// test_row_parallel_linear_gpu: the project's kernel on one GPU and the row-parallel linear on a
// line of 1..N GPU ranks against the CPU reference: under meshtest's error model on random
// inputs, exact on integer ones and a closed form, the same bits on every device, and bad input.
// meshtest::gpu_gtest_main binds every rank to its GPU, or skips every test with the reason.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "dist/gpu/ccl/ccl.hpp"
#include "dist/shard/placement.hpp"
#include "dist/testing/gpu/gpu_test.hpp"
#include "row_parallel_linear_gpu.hpp"
#include "src/core/random.hpp"

namespace row_parallel_gpu {
namespace {

using namespace meshtest;
using namespace meshtest::dist;
using namespace meshtest::dist::testing;

Tensor reference(const std::vector<Tensor>& in) { return reference_linear(in[0], in[1], in[2]); }
Tensor normal(Shape s, DType t, std::uint64_t seed) { return random_normal(s, t, {.seed = seed}); }
DeviceTensor on_gpu(const Tensor& t) { return DeviceTensor::from_host(t); }
/// This device's slice of t's columns (K), on its GPU.
DeviceTensor k_slice(const MeshDevice& mesh, const Tensor& t) {
  return on_gpu(distribute(t, mesh, placements_1d(Shard{1})));
}
// M x N x K off the 16 x 16 tile, smaller than one tile, and empty.
constexpr std::int64_t kSizes[][3] = {{1, 1, 1}, {16, 16, 16}, {33, 17, 45}, {5, 70, 300},
                                      {0, 4, 3}, {4, 0, 3},    {4, 5, 0}};

TEST(RowParallelLinearGpu, KernelOnOneGpuWithinTheErrorModel) {
  // K products and the bias per element, or K alone.
  for (const DType t : {DType::f32, DType::f64}) {
    for (const auto [m, n, k] : kSizes) {
      const Tensor x = normal({m, k}, t, 1), w = normal({n, k}, t, 2), b = normal({n}, t, 3);
      EXPECT_TRUE(within_model(linear(on_gpu(x), on_gpu(w), on_gpu(b)), reference, {x, w, b},
                               gemm_terms(k + 1)));
      EXPECT_TRUE(within_model(linear(on_gpu(x), on_gpu(w)), reference, {x, w, Tensor(Shape{n}, t)},
                               gemm_terms(k)));
    }
  }
}

TEST(RowParallelLinearGpu, ShardedRandomInputsWithinTheErrorModel) {
  // K products, the bias and the p partials the all_reduce adds per element; the same bits on
  // every device; the bias added twice must fail the same check.
  const MeshDevice mesh = MeshDevice::line();
  const int p = mesh.size();
  for (const DType t : {DType::f32, DType::f64}) {
    for (const std::int64_t k : {97, 1000}) {
      const Tensor x = normal({33, k}, t, 21), w = normal({40, k}, t, 22), b = normal({40}, t, 23);
      const DeviceTensor on_device =
          row_parallel_linear(mesh, k_slice(mesh, x), k_slice(mesh, w), on_gpu(b));
      EXPECT_TRUE(on_device.bitwise_equal(broadcast(mesh, on_device, {.root = 0})));
      const Tensor y = on_device.to_host();
      EXPECT_TRUE(within_model(y, reference, {x, w, b}, gemm_terms(k + 1 + p)));
      Tensor twice = y.astype(DType::f64);
      for (std::int64_t e = 0; e < twice.numel(); ++e) twice.data<double>()[e] += b.item(e % 40);
      EXPECT_FALSE(within_model(twice.astype(t), reference, {x, w, b}, gemm_terms(k + 1 + p)));
    }
  }
}

TEST(RowParallelLinearGpu, ExactOnIntegersAndTheClosedForm) {
  // Small integers add exactly in any order: the gathered y equals the reference bit for bit,
  // with K uneven over the devices (13), a device left empty (3) and no K at all (0).
  const MeshDevice mesh = MeshDevice::line();
  for (const std::int64_t k : {13, 3, 0}) {  // the harness splits, runs and gathers
    const auto ints = [](Shape s, std::uint64_t seed) {
      return random_integers(s, DType::f32, {.seed = seed}, -4, 4);
    };
    expect_gpu_matches_single_device(
        mesh,
        {{ints({5, k}, 11), placements_1d(Shard{1})},
         {ints({7, k}, 12), placements_1d(Shard{1})},
         {ints({7}, 13)}},
        [](const std::vector<Tensor>& in) { return reference(in).astype(DType::f32); },
        [](const MeshDevice& m, const std::vector<DeviceTensor>& in) {
          return row_parallel_linear(m, in[0], in[1], in[2]);
        },
        kReplicated, {.metric = Metric::exact});
  }
  // x = 1, W[n, k] = k + 1, b = 0  =>  y = K (K + 1) / 2 on every element, exact in f32.
  const std::int64_t k = 4 * mesh.size() + 3;
  Tensor x(Shape{3, k}, DType::f32), w(Shape{5, k}, DType::f32), want(Shape{3, 5}, DType::f32);
  x.fill(1.0);
  for (std::int64_t e = 0; e < w.numel(); ++e) w.data<float>()[e] = float(e % k + 1);
  want.fill(double(k * (k + 1) / 2));
  const DeviceTensor y = row_parallel_linear(mesh, k_slice(mesh, x), k_slice(mesh, w),
                                             DeviceTensor(Shape{5}, DType::f32));
  EXPECT_TRUE(y.to_host().bitwise_equal(want));
}

TEST(RowParallelLinearGpu, BadInputIsAnErrorOnEveryDevice) {
  const MeshDevice mesh = MeshDevice::line();
  const auto dev = [](Shape s, DType t = DType::f32) { return DeviceTensor(s, t); };
  const DeviceTensor x = dev({2, 3}), w = dev({4, 3}), b = dev({4});
  MESHTEST_EXPECT_ERROR(row_parallel_linear(mesh, x, dev({4, 2}), b), "disagree on K (3 and 2");
  MESHTEST_EXPECT_ERROR(row_parallel_linear(mesh, x, w, dev({5})), "does not match N = 4");
  MESHTEST_EXPECT_ERROR(row_parallel_linear(mesh, x, w, dev({4}, DType::f64)), "bias f64");
  const DType h = DType::bf16;
  MESHTEST_EXPECT_ERROR(row_parallel_linear(mesh, dev({2, 3}, h), dev({4, 3}, h), dev({4}, h)),
                        "dtype bf16 is not supported (f32 or f64)");
  MESHTEST_EXPECT_ERROR(linear(dev({6}), w), "must both be 2-D");
  // Device 1 alone has N = 5: the all_reduce finds it, every device throws, the mesh goes on.
  const std::int64_t n = mesh.device_id() == 1 ? 5 : 4;
  if (mesh.size() > 1) {
    MESHTEST_EXPECT_ERROR(row_parallel_linear(mesh, x, dev({n, 3}), dev({n})), "disagree");
  }
  Tensor one(Shape{1, 1}, DType::f32);
  one.fill(1.0);
  const DeviceTensor sum = row_parallel_linear(mesh, on_gpu(one), on_gpu(one), dev({1}));
  EXPECT_EQ(sum.to_host().item(0), mesh.size());
}

}  // namespace
}  // namespace row_parallel_gpu
