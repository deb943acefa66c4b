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
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/dp/real.hpp"
#include "src/perf/profiler.hpp"
#include "tests/support/dp_reference.hpp"

namespace meshtest::dist {
namespace {

using ccl_test::expect_error;
using test_support::coef_scale;
using test_support::dp_terms;
using test_support::DpTerms;
using test_support::expect_within;

// FsdpDpSgd keeps a reference to its mesh: a temporary mesh must not compile.
static_assert(
    std::is_constructible_v<FsdpDpSgd, const MeshDevice&, const dp::Sequential&, dp::DpSgdOptions>);
static_assert(
    !std::is_constructible_v<FsdpDpSgd, MeshDevice&&, const dp::Sequential&, dp::DpSgdOptions>);
static_assert(
    !std::is_constructible_v<FsdpDpSgd, MeshDevice, const dp::Sequential&, dp::DpSgdOptions>);

constexpr const char* kSpec = "linear:7,gelu,rmsnorm,linear:5";
constexpr std::int64_t kIn = 6, kOut = 5, kSeq = 3;
constexpr int kSteps = 10;

// The global batch of a step: x [B, T, 6], mse targets [B, T, 5] or ce classes [B, T].
struct Batch {
  Tensor x, y;
};
Batch global_batch(std::int64_t b, int step, DType dt, dp::LossKind loss) {
  Batch r{.x = random_normal({b, kSeq, kIn}, dt,
                             {.seed = 1000, .stream = static_cast<std::uint64_t>(step)}),
          .y = {}};
  r.y = loss == dp::LossKind::mse
            ? random_normal({b, kSeq, kOut}, dt,
                            {.seed = 2000, .stream = static_cast<std::uint64_t>(step)})
            : random_integers({b, kSeq}, DType::i64,
                              {.seed = 3000, .stream = static_cast<std::uint64_t>(step)}, 0,
                              kOut - 1);
  return r;
}

struct Case {
  std::string mode;
  DType dtype;
  dp::LossKind loss;
  dp::Reduction reduction;
  dp::OptimizerKind optimizer;
  std::int64_t batch;  // global; < np leaves some devices without samples
};

std::string label(const Case& c, int np) {
  return fmt::format("mode={} {} loss={} reduction={} opt={} B={} np={}", c.mode,
                     dtype_name(c.dtype), dp::loss_name(c.loss), dp::reduction_name(c.reduction),
                     c.optimizer == dp::OptimizerKind::sgd ? "sgd" : "adam", c.batch, np);
}

// C = the median per-sample norm of the first batch: some samples are clipped, some not.
double median_norm(const dp::Sequential& model, const Batch& b, const dp::DpOptions& opt) {
  const dp::DpGrads g = dp::PrivateModel(model, "hooks", opt).compute(b.x, b.y);
  std::vector<double> n;
  for (std::int64_t i = 0; i < g.norms.numel(); ++i) n.push_back(g.norms.item(i));
  std::sort(n.begin(), n.end());
  return n[n.size() / 2];
}

// kSteps steps with noise on N devices and on one; compares parameters and per-sample norms.
void run_case(const MeshDevice& mesh, const Case& c) {
  const int n = mesh.size(), r = mesh.device_id();
  const std::string l = label(c, n);
  const dp::Sequential model = dp::parse_model(kSpec, kIn, c.dtype, {.seed = 5});
  dp::DpSgdOptions opt{.mode = c.mode,
                       .dp = {.clip = 1, .loss = c.loss, .reduction = c.reduction},
                       .noise = {.sigma = 0.6, .seed = 77},
                       .optimizer = {.kind = c.optimizer, .lr = 0.05}};
  opt.dp.clip = median_norm(model, global_batch(c.batch, 0, c.dtype, c.loss), opt.dp);
  FsdpDpSgd fsdp(mesh, model, opt);
  dp::DpSgd single(model, opt);
  // The same steps in another order (dp_terms; each device's samples, then the reduce_scatter
  // over n devices, the noise and the optimizer's update: 4); each step's error enters the next
  // through the parameters: n adds up over the steps.
  const DpTerms terms = dp_terms(model, global_batch(c.batch, 0, c.dtype, c.loss).x);
  const std::int64_t per_step = terms.clipped + n + 4;
  const auto after = [&](int steps) {
    return ErrorModel{
        .dtype = c.dtype, .terms = steps * per_step, .reference = Reference::other_order};
  };
  int clipped = 0, unclipped = 0;
  for (int step = 0; step < kSteps; ++step) {
    const Batch all = global_batch(c.batch, step, c.dtype, c.loss);
    const Range mine = split_range(c.batch, n, r);
    const dp::StepReport got = fsdp.step(all.x.slice(0, mine), all.y.slice(0, mine));
    const dp::StepReport want = single.step(all.x, all.y);
    if (c.mode == "non_private") continue;
    // Per-sample norms: this device's samples, complete here (never reduced across devices).
    ASSERT_EQ(got.norms.shape(), Shape{mine.size}) << l;
    const std::string at = fmt::format("{} step {}", l, step);
    const Tensor want_norms = want.norms.slice(0, mine), want_coef = want.coef.slice(0, mine);
    expect_within(want_norms, got.norms, after(step + 1), at + " norms");
    expect_within(want_coef, got.coef, after(step + 1), at + " coef",
                  coef_scale(want_norms, want_coef));
    for (std::int64_t i = 0; i < want.coef.numel(); ++i)
      (want.coef.item(i) < 1 ? clipped : unclipped)++;
  }
  if (c.mode != "non_private") {
    EXPECT_GT(clipped, 0) << l << ": C should clip some samples";
    EXPECT_GT(unclipped, 0) << l << ": and leave others";
  }
  const std::vector<Tensor> params = fsdp.gather_parameters();
  const auto want = single.model().parameters();
  ASSERT_EQ(params.size(), want.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    expect_within(want[p]->value, params[p], after(kSteps), l + " " + want[p]->name);
  }
  // Shards follow array_split of the flattened parameter and the values are freed.
  for (std::size_t p = 0; p < params.size(); ++p) {
    EXPECT_EQ(fsdp.shards()[p].numel(), split_range(want[p]->shape.numel(), n, r).size);
    EXPECT_TRUE(dp::is_unset(fsdp.model().parameters()[p]->value)) << want[p]->name;
  }
}

TEST(FsdpDpSgd, TenNoisyStepsEqualSingleDeviceF64) {
  const MeshDevice mesh = MeshDevice::line();
  for (const std::string mode : {"fused_bk", "fused", "ghost", "hooks"}) {
    run_case(mesh, {mode, DType::f64, dp::LossKind::mse, dp::Reduction::mean,
                    dp::OptimizerKind::adam, 11});
  }
  run_case(mesh, {"fused_bk", DType::f64, dp::LossKind::ce, dp::Reduction::sum,
                  dp::OptimizerKind::sgd, 11});
  run_case(mesh, {"non_private", DType::f64, dp::LossKind::mse, dp::Reduction::mean,
                  dp::OptimizerKind::sgd, 9});
}

TEST(FsdpDpSgd, TenNoisyStepsEqualSingleDeviceF32) {
  const MeshDevice mesh = MeshDevice::line();
  run_case(mesh, {"fused_bk", DType::f32, dp::LossKind::mse, dp::Reduction::mean,
                  dp::OptimizerKind::adam, 10});
  run_case(mesh,
           {"ghost", DType::f32, dp::LossKind::ce, dp::Reduction::sum, dp::OptimizerKind::sgd, 10});
}

TEST(FsdpDpSgd, DevicesWithoutSamples) {
  // B = 3 over more than 3 devices: some hold no sample in a step (legal).
  const MeshDevice mesh = MeshDevice::line();
  run_case(mesh, {"fused_bk", DType::f64, dp::LossKind::mse, dp::Reduction::mean,
                  dp::OptimizerKind::adam, 3});
  run_case(mesh,
           {"fused", DType::f64, dp::LossKind::ce, dp::Reduction::mean, dp::OptimizerKind::sgd, 3});
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
  // fused_bk: every parameter gathered once for forward and once for backward, one
  // reduce_scatter per parameter; ghost gathers again for its second backward.
  const MeshDevice mesh = MeshDevice::line();
  const dp::Sequential model = dp::parse_model(kSpec, kIn, DType::f64, {.seed = 5});
  const std::size_t params = model.parameters().size();  // 5
  for (const auto& [mode, gathers] : std::vector<std::pair<std::string, std::size_t>>{
           {"fused_bk", 2 * params}, {"ghost", 3 * params}}) {
    FsdpDpSgd fsdp(mesh, model, {.mode = mode, .dp = {.clip = 1e-3}, .noise = {}, .optimizer = {}});
    const Batch all = global_batch(4, 0, DType::f64, dp::LossKind::mse);
    const Range mine = split_range(4, mesh.size(), mesh.device_id());
    perf::Session session;
    fsdp.step(all.x.slice(0, mine), all.y.slice(0, mine));
    std::size_t ag = 0, rs = 0;
    for (const auto& rec : perf::records()) {
      ag += rec.op_code == "all_gather";
      rs += rec.op_code == "reduce_scatter";
    }
    EXPECT_EQ(ag, gathers) << mode;
    EXPECT_EQ(rs, params) << mode;
  }
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
