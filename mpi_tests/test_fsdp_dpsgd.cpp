// FSDP DP-SGD on N devices against single-device DP-SGD on the concatenated batch: parameters
// after 10 noisy steps, per-sample norms of each device's own samples (both within the error
// model of the steps' chain, src/check/tolerance.hpp), gathers, bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "dist/ccl/all_reduce.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/fsdp.hpp"
#include "mpi_tests/support/ccl_expect_error.hpp"
#include "mpi_tests/support/fsdp_cases.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/dp/real.hpp"
#include "src/perf/profiler.hpp"
#include "tests/support/dp_reference.hpp"

namespace meshtest::dist {
namespace {

using ccl_test::expect_error;
using test_support::dp_terms;
using test_support::expect_within;

// FsdpDpSgd keeps a reference to its mesh: a temporary mesh must not compile.
static_assert(
    std::is_constructible_v<FsdpDpSgd, const MeshDevice&, const dp::Sequential&, dp::DpSgdOptions>);
static_assert(
    !std::is_constructible_v<FsdpDpSgd, MeshDevice&&, const dp::Sequential&, dp::DpSgdOptions>);
static_assert(
    !std::is_constructible_v<FsdpDpSgd, MeshDevice, const dp::Sequential&, dp::DpSgdOptions>);

using fsdp_test::Batch;
using fsdp_test::Case;
using fsdp_test::global_batch;
using fsdp_test::kIn;
using fsdp_test::kOut;
using fsdp_test::kSeq;
using fsdp_test::kSpec;
using fsdp_test::kSteps;

// kSteps steps with noise on N devices and on one; compares parameters and per-sample norms.
void run_case(const MeshDevice& mesh, const Case& c) {
  const int n = mesh.size(), r = mesh.device_id();
  SCOPED_TRACE(fsdp_test::label(c, n));
  const dp::Sequential model = dp::parse_model(kSpec, kIn, c.dtype, {.seed = 5});
  const dp::DpSgdOptions opt = fsdp_test::options_of(c, model);
  FsdpDpSgd fsdp(mesh, model, opt);
  dp::DpSgd single(model, opt);
  fsdp_test::StepChecks checks(model, c, n);
  for (int step = 0; step < kSteps; ++step) {
    const Batch all = global_batch(c.batch, step, c.dtype, c.loss);
    const Range mine = split_range(c.batch, n, r);
    const dp::StepReport got = fsdp.step(all.x.slice(0, mine), all.y.slice(0, mine));
    checks.step(step, got, single.step(all.x, all.y), mine);
  }
  checks.finish();
  const std::vector<Tensor> params = fsdp.gather_parameters();
  const auto want = single.model().parameters();
  ASSERT_EQ(params.size(), want.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    expect_within(want[p]->value, params[p], checks.after(kSteps), want[p]->name);
  }
  // Shards follow array_split of the flattened parameter and the values are freed.
  for (std::size_t p = 0; p < params.size(); ++p) {
    EXPECT_EQ(fsdp.shards()[p].numel(), split_range(want[p]->shape.numel(), n, r).size);
    EXPECT_TRUE(dp::is_unset(fsdp.model().parameters()[p]->value)) << want[p]->name;
  }
}

TEST(FsdpDpSgd, TenNoisyStepsEqualSingleDeviceF64) {
  const MeshDevice mesh = MeshDevice::line();
  for (const Case& c : fsdp_test::noisy_f64_cases()) run_case(mesh, c);
}

TEST(FsdpDpSgd, TenNoisyStepsEqualSingleDeviceF32) {
  const MeshDevice mesh = MeshDevice::line();
  run_case(mesh, {"fused_bk", DType::f32, dp::LossKind::mse, dp::Reduction::mean,
                  dp::OptimizerKind::adam, 10});
  run_case(mesh,
           {"ghost", DType::f32, dp::LossKind::ce, dp::Reduction::sum, dp::OptimizerKind::sgd, 10});
}

TEST(FsdpDpSgd, DevicesWithoutSamples) {
  const MeshDevice mesh = MeshDevice::line();
  for (const Case& c : fsdp_test::devices_without_samples_cases()) run_case(mesh, c);
}

TEST(FsdpDpSgd, NormAllReduceBugWouldBeCaught) {
  // The known FSDP bug: all-reducing per-sample norms across data-parallel devices (adding norms
  // of different samples). The comparison used above must reject what that bug produces.
  const MeshDevice mesh = MeshDevice::line();
  const int n = mesh.size();
  if (n < 2) GTEST_SKIP() << "needs 2 devices to have samples on another device";
  const std::int64_t per = 2, batch = per * n;  // equal local batches, so the buggy reduce fits
  const dp::Sequential model = dp::parse_model(kSpec, kIn, DType::f64, {.seed = 5});
  const dp::DpSgdOptions opt{.mode = "fused_bk", .dp = {.clip = 0.4}, .noise = {}, .optimizer = {}};
  FsdpDpSgd fsdp(mesh, model, opt);
  dp::DpSgd single(model, opt);
  const Batch all = global_batch(batch, 0, DType::f64, dp::LossKind::mse);
  const Range mine = split_range(batch, n, mesh.device_id());
  const dp::StepReport got = fsdp.step(all.x.slice(0, mine), all.y.slice(0, mine));
  const dp::StepReport want = single.step(all.x, all.y);
  Tensor sq = got.norms;
  sq.vector<double>() = sq.vector<double>().array().square().matrix();
  all_reduce_inplace(mesh, sq);
  sq.vector<double>() = sq.vector<double>().cwiseSqrt();
  const ErrorModel m{.dtype = DType::f64,
                     .terms = dp_terms(model, all.x).norm,
                     .reference = Reference::other_order};
  const Tensor expected = want.norms.slice(0, mine);
  EXPECT_FALSE(compare(expected, sq, m).passed) << "the buggy norms went unnoticed";
  expect_within(expected, got.norms, m, "norms");
}

TEST(FsdpDpSgd, GathersBeforeForwardAndBackward) {
  const MeshDevice mesh = MeshDevice::line();
  const dp::Sequential model = dp::parse_model(kSpec, kIn, DType::f64, {.seed = 5});
  fsdp_test::expect_gathers_per_pass(mesh, [&](const std::string& mode, const Batch& all,
                                               Range mine) {
    FsdpDpSgd fsdp(mesh, model, {.mode = mode, .dp = {.clip = 1e-3}, .noise = {}, .optimizer = {}});
    fsdp.step(all.x.slice(0, mine), all.y.slice(0, mine));
  });
}

TEST(FsdpDpSgd, BadInputOnOneDeviceFailsEverywhere) {
  const MeshDevice mesh = MeshDevice::line();
  const dp::Sequential model = dp::parse_model(kSpec, kIn, DType::f64, {.seed = 5});
  FsdpDpSgd fsdp(mesh, model, {.mode = "fused_bk", .dp = {}, .noise = {}, .optimizer = {}});
  const bool last = mesh.device_id() == mesh.size() - 1;
  const Tensor x = random_normal({2, kSeq, last ? kIn + 1 : kIn}, DType::f64, {.seed = 1});
  const Tensor y = random_normal({2, kSeq, kOut}, DType::f64, {.seed = 2});
  try {
    fsdp.step(x, y);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("device {}", mesh.size() - 1)),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("features, expected 6"), std::string::npos) << e.what();
  }
  expect_error(
      mesh, kAllAxes, "mode",
      [&] { FsdpDpSgd(mesh, model, {.mode = "flash", .dp = {}, .noise = {}, .optimizer = {}}); },
      {"unknown DP mode 'flash'", "registered: fused, fused_bk, ghost, hooks, non_private"});
  expect_error(mesh, kAllAxes, "clip",
               [&] {
                 FsdpDpSgd(mesh, model,
                           {.mode = "ghost", .dp = {.clip = 0}, .noise = {}, .optimizer = {}});
               },
               {"clip norm C is 0, expected a finite C > 0"});
  expect_error(mesh, kAllAxes, "sigma",
               [&] {
                 FsdpDpSgd(mesh, model,
                           {.mode = "ghost", .dp = {}, .noise = {.sigma = -1}, .optimizer = {}});
               },
               {"FsdpDpSgd: noise multiplier sigma is -1, expected a finite sigma >= 0"});
}

}  // namespace
}  // namespace meshtest::dist
