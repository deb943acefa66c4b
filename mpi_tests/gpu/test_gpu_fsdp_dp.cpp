// FSDP DP-SGD on GPU ranks (dist/gpu/parallel/fsdp_dp.hpp) against single-device DP-SGD on the
// CPU (dp::DpSgd) on the concatenated batch and against one GPU (gpu::dp::Model on the whole
// batch): parameters after 10 noisy steps in every mode, f64 and f32, SGD and Adam, the
// per-sample norms and clip coefficients of each device's own samples, all within the error
// model of the steps' chain (docs/tolerances.md); devices without samples; the layers freed
// outside a step and the shards' sizes; one reduce_scatter per parameter and a gather per pass;
// bad input on one device failing on every device.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "dist/gpu/parallel/fsdp_dp.hpp"
#include "dist/testing/gpu/gpu_test.hpp"
#include "mpi_tests/gpu/gpu_terms.hpp"
#include "mpi_tests/support/ccl_expect_error.hpp"
#include "mpi_tests/support/fsdp_cases.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/perf/profiler.hpp"
#include "tests/support/dp_reference.hpp"

namespace meshtest::dist {
namespace {

namespace mg = meshtest::gpu;
using ccl_test::expect_error;
using test_support::dp_terms;
using test_support::DpTerms;
using test_support::expect_within;

// GpuFsdpDpSgd keeps a reference to its mesh: a temporary mesh must not compile.
static_assert(std::is_constructible_v<GpuFsdpDpSgd, const MeshDevice&, mg::Blas&,
                                      const dp::Sequential&, dp::DpSgdOptions>);
static_assert(!std::is_constructible_v<GpuFsdpDpSgd, MeshDevice&&, mg::Blas&, const dp::Sequential&,
                                       dp::DpSgdOptions>);

using fsdp_test::Batch;
using fsdp_test::Case;
using fsdp_test::global_batch;
using fsdp_test::kIn;
using fsdp_test::kOut;
using fsdp_test::kSeq;
using fsdp_test::kSpec;
using fsdp_test::kSteps;

mg::DeviceTensor on_gpu(const Tensor& t) { return mg::DeviceTensor::from_host(t); }

// kSteps noisy steps on the GPU ranks, on the CPU and (without noise, SGD) on one GPU;
// compares parameters and each device's per-sample norms and coefficients.
void run_case(const MeshDevice& mesh, const Case& c) {
  const int n = mesh.size(), r = mesh.device_id();
  SCOPED_TRACE(fsdp_test::label(c, n));
  const dp::Sequential model = dp::parse_model(kSpec, kIn, c.dtype, {.seed = 5});
  const dp::DpSgdOptions opt = fsdp_test::options_of(c, model);
  mg::Blas blas;
  GpuFsdpDpSgd fsdp(mesh, blas, model, opt);
  dp::DpSgd cpu(model, opt);
  // One GPU on the whole batch, SGD by hand (the noiseless SGD cases).
  const bool one_gpu = c.sigma == 0 && c.optimizer == dp::OptimizerKind::sgd;
  mg::dp::Model single(blas, model);
  fsdp_test::StepChecks checks(model, c, n);
  for (int step = 0; step < kSteps; ++step) {
    const Batch all = global_batch(c.batch, step, c.dtype, c.loss);
    const Range mine = split_range(c.batch, n, r);
    const dp::StepReport got =
        fsdp.step(on_gpu(all.x.slice(0, mine)), on_gpu(all.y.slice(0, mine)));
    for (std::size_t k = 0; k < 4; ++k) EXPECT_FALSE(fsdp.gathered(k)) << "layer " << k;
    checks.step(step, got, cpu.step(all.x, all.y), mine);
    if (one_gpu) {
      const mg::dp::Grads g = single.compute(on_gpu(all.x), on_gpu(all.y), c.mode, opt.dp);
      single.sgd_step(g.grads, opt.optimizer.lr);
    }
  }
  checks.finish();
  const std::vector<Tensor> params = fsdp.gather_parameters();
  const auto want = cpu.model().parameters();
  const std::vector<Tensor> one = single.parameters();
  ASSERT_EQ(params.size(), want.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    expect_within(want[p]->value, params[p], checks.after(kSteps), want[p]->name + " vs CPU");
    if (one_gpu) {
      expect_within(one[p], params[p], checks.after(kSteps), want[p]->name + " vs one GPU");
    }
    // Shards follow array_split of the flattened parameter.
    EXPECT_EQ(fsdp.shards()[p].numel(), split_range(want[p]->shape.numel(), n, r).size);
  }
}

TEST(GpuFsdpDpSgd, TenNoisyStepsEqualTheCpuF64) {
  const MeshDevice& mesh = gpu::mesh_of(1, testing::world_size());
  for (const Case& c : fsdp_test::noisy_f64_cases()) run_case(mesh, c);
}

TEST(GpuFsdpDpSgd, TenStepsEqualOneGpuAndTheCpuF32) {
  const MeshDevice& mesh = gpu::mesh_of(1, testing::world_size());
  run_case(mesh, {"fused_bk", DType::f32, dp::LossKind::mse, dp::Reduction::mean,
                  dp::OptimizerKind::adam, 10});
  for (const std::string mode : {"fused_bk", "ghost", "non_private"}) {
    run_case(mesh, {mode, DType::f32, dp::LossKind::ce, dp::Reduction::sum, dp::OptimizerKind::sgd,
                    10, 0.0});
  }
}

TEST(GpuFsdpDpSgd, DevicesWithoutSamples) {
  const MeshDevice& mesh = gpu::mesh_of(1, testing::world_size());
  for (const Case& c : fsdp_test::devices_without_samples_cases()) run_case(mesh, c);
}

TEST(GpuFsdpDpSgd, OnAnAxisOfA2DMesh) {
  // FSDP over one axis of a 2 x (N/2) mesh: the other axis's groups run the same steps apart.
  const int world = testing::world_size();
  if (world % 2 != 0) GTEST_SKIP() << "needs an even number of GPU ranks; this job has " << world;
  const MeshDevice& mesh = gpu::mesh_of(2, world / 2);
  const dp::Sequential model = dp::parse_model(kSpec, kIn, DType::f64, {.seed = 5});
  const dp::DpSgdOptions opt{.mode = "fused_bk",
                             .dp = {.clip = 0.5},
                             .noise = {.sigma = 0.3, .seed = 9},
                             .optimizer = {.kind = dp::OptimizerKind::sgd, .lr = 0.05}};
  mg::Blas blas;
  GpuFsdpDpSgd fsdp(mesh, blas, model, opt, 1);
  dp::DpSgd cpu(model, opt);
  const int n = mesh.axis_size(1), r = mesh.axis_index(1);
  for (int step = 0; step < 3; ++step) {
    const Batch all = global_batch(5, step, DType::f64, dp::LossKind::mse);
    const Range mine = split_range(5, n, r);
    fsdp.step(on_gpu(all.x.slice(0, mine)), on_gpu(all.y.slice(0, mine)));
    cpu.step(all.x, all.y);
  }
  const std::vector<Tensor> got = fsdp.gather_parameters();
  const DpTerms terms = dp_terms(model, global_batch(5, 0, DType::f64, dp::LossKind::mse).x);
  const ErrorModel m{.dtype = DType::f64,
                     .terms = 3 * (terms.clipped + n + 4),
                     .reference = Reference::other_order};
  const auto want = cpu.model().parameters();
  for (std::size_t p = 0; p < got.size(); ++p) expect_within(want[p]->value, got[p], m, "param");
}

TEST(GpuFsdpDpSgd, GathersPerPassAndOneReduceScatterPerParameter) {
  const MeshDevice& mesh = gpu::mesh_of(1, testing::world_size());
  const dp::Sequential model = dp::parse_model(kSpec, kIn, DType::f64, {.seed = 5});
  mg::Blas blas;
  fsdp_test::expect_gathers_per_pass(
      mesh, [&](const std::string& mode, const Batch& all, Range mine) {
        GpuFsdpDpSgd fsdp(mesh, blas, model,
                          {.mode = mode, .dp = {.clip = 1e-3}, .noise = {}, .optimizer = {}});
        fsdp.step(on_gpu(all.x.slice(0, mine)), on_gpu(all.y.slice(0, mine)));
      });
}

TEST(GpuFsdpDpSgd, BadInputOnOneDeviceFailsEverywhere) {
  const MeshDevice& mesh = gpu::mesh_of(1, testing::world_size());
  const dp::Sequential model = dp::parse_model(kSpec, kIn, DType::f64, {.seed = 5});
  mg::Blas blas;
  GpuFsdpDpSgd fsdp(mesh, blas, model,
                    {.mode = "fused_bk", .dp = {}, .noise = {}, .optimizer = {}});
  const int last = mesh.size() - 1;
  const bool is_last = mesh.device_id() == last;
  const Tensor x = random_normal({2, kSeq, is_last ? kIn + 1 : kIn}, DType::f64, {.seed = 1});
  const Tensor y = random_normal({2, kSeq, kOut}, DType::f64, {.seed = 2});
  expect_error(mesh, kAllAxes, "features", [&] { fsdp.step(on_gpu(x), on_gpu(y)); },
               {fmt::format("device {}", last), "input has 7 features, expected 6"});
  const Tensor classes = Tensor::from_vector<std::int64_t>({1, kSeq}, {0, is_last ? 9 : 1, 2});
  GpuFsdpDpSgd ce(
      mesh, blas, model,
      {.mode = "ghost", .dp = {.loss = dp::LossKind::ce}, .noise = {}, .optimizer = {}});
  expect_error(
      mesh, kAllAxes, "classes",
      [&] {
        ce.step(on_gpu(random_normal({1, kSeq, kIn}, DType::f64, {.seed = 3})), on_gpu(classes));
      },
      {fmt::format("device {}", last), "target 9 at row 1 is outside [0, 5)"});
  expect_error(
      mesh, kAllAxes, "mode",
      [&] {
        GpuFsdpDpSgd(mesh, blas, model, {.mode = "flash", .dp = {}, .noise = {}, .optimizer = {}});
      },
      {"unknown DP mode 'flash'", "registered: fused, fused_bk, ghost, hooks, non_private"});
  expect_error(mesh, kAllAxes, "clip",
               [&] {
                 GpuFsdpDpSgd(mesh, blas, model,
                              {.mode = "ghost", .dp = {.clip = 0}, .noise = {}, .optimizer = {}});
               },
               {"clip norm C is 0, expected a finite C > 0"});
  expect_error(mesh, kAllAxes, "sigma",
               [&] {
                 GpuFsdpDpSgd(mesh, blas, model,
                              {.mode = "ghost", .dp = {}, .noise = {.sigma = -1}, .optimizer = {}});
               },
               {"GpuFsdpDpSgd: noise multiplier sigma is -1, expected a finite sigma >= 0"});
  // The mesh is still in step: a good step after the errors.
  const Batch all = global_batch(mesh.size(), 0, DType::f64, dp::LossKind::mse);
  const Range mine = split_range(mesh.size(), mesh.size(), mesh.device_id());
  const dp::StepReport ok = fsdp.step(on_gpu(all.x.slice(0, mine)), on_gpu(all.y.slice(0, mine)));
  EXPECT_EQ(ok.norms.numel(), 1);
}

}  // namespace
}  // namespace meshtest::dist
