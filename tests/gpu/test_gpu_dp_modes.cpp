// The DP modes on a GPU model (src/gpu/dp_model.hpp) against the CPU: every mode's per-sample
// norms, clip coefficients, clipped gradient sums and loss against the CPU mode on the same
// weights and batch and against the reference built one sample at a time
// (tests/support/dp_reference.hpp), f64 and f32, within the error model of the same
// computation in another order; the parameters after 10 SGD steps; every mode against every
// other; the fused mode's single pass when no sample is clipped; the bad inputs.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/dp/modes.hpp"
#include "src/dp/optimizer.hpp"
#include "src/dp/real.hpp"
#include "src/dp/sequential.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/dp_model.hpp"
#include "tests/support/dp_mode_cases.hpp"
#include "tests/support/dp_reference.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::gpu {
namespace {

using meshtest::dp::DpOptions;
using meshtest::dp::LossKind;
using meshtest::dp::PrivateModel;
using meshtest::dp::Reduction;
using meshtest::dp::Sequential;
using test_support::as_tensor;
using test_support::coef_scale;
using test_support::dp_reference;
using test_support::dp_terms;
using test_support::DpTerms;
using test_support::expect_error;
using test_support::expect_within;

const std::vector<std::string> kModes = {"non_private", "hooks", "ghost", "fused", "fused_bk"};

using ModelCase = test_support::DpModelCase;
using Batch = test_support::DpBatch;
using test_support::median_clip;

const std::vector<ModelCase>& kModels = test_support::dp_model_cases();

Batch make_batch(const Sequential& m, const ModelCase& c, DType dt, std::uint64_t seed) {
  return test_support::make_dp_batch(m, c.batch, c.seq, c.din, c.loss, dt, seed);
}

std::string label(const ModelCase& c, DType dt, const std::string& mode, Reduction r) {
  return fmt::format("{} {} din={} B={} T={} {} {} mode={}", c.spec, dt, c.din, c.batch, c.seq,
                     meshtest::dp::loss_name(c.loss), meshtest::dp::reduction_name(r), mode);
}

/// The largest error / bound seen per row of the table printed at the end ("f32 hooks vs the
/// CPU mode", then norms, coef, grads, loss).
using Worst = std::map<std::string, std::array<double, 4>>;

/// Expects got within m of want (scale: per element, or max |want|) and records error / bound.
void within(const Tensor& want, const Tensor& got, const ErrorModel& m, const std::string& what,
            double& worst, const std::optional<Tensor>& scale = std::nullopt) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const Comparison c = scale ? compare(want, got, m, *scale) : compare(want, got, m);
  EXPECT_TRUE(c.passed) << what << ": " << c;
  worst = std::max(worst, c.value);
}

/// The GPU's norms, coefficients, clipped sums and loss against `want` (the CPU mode's, or the
/// reference's), in `dt` in another order: n.norm terms for the norms, n.clipped for the sums.
void expect_grads(const meshtest::dp::DpGrads& want, const dp::Grads& got, DType dt,
                  const DpTerms& n, const std::string& what, std::array<double, 4>& worst) {
  const ErrorModel norm{.dtype = dt, .terms = n.norm};
  const ErrorModel clipped{.dtype = dt, .terms = n.clipped};
  if (!meshtest::dp::is_unset(want.norms)) {
    within(want.norms, got.norms, norm, what + " norms", worst[0]);
    within(want.coef, got.coef, norm, what + " coef", worst[1], coef_scale(want.norms, want.coef));
  } else {
    EXPECT_TRUE(meshtest::dp::is_unset(got.norms)) << what;
  }
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  for (std::size_t p = 0; p < want.grads.size(); ++p) {
    within(want.grads[p], got.grads[p].to_host(), clipped, fmt::format("{} param {}", what, p),
           worst[2]);
  }
  within(as_tensor({want.loss}), as_tensor({got.loss}), clipped, what + " loss", worst[3]);
}

TEST(GpuDpModes, EveryModeMatchesTheCpuModeAndTheReference) {
  Blas blas;
  Worst worst;
  for (const ModelCase& c : kModels) {
    for (const DType dt : {DType::f64, DType::f32}) {
      const Sequential m = meshtest::dp::parse_model(c.spec, c.din, dt, {.seed = 7});
      const Batch bt = make_batch(m, c, dt, 8);
      const DpTerms n = dp_terms(m, bt.x);
      const DeviceTensor x = DeviceTensor::from_host(bt.x), y = DeviceTensor::from_host(bt.y);
      for (const Reduction red : {Reduction::mean, Reduction::sum}) {
        DpOptions opt{.clip = 1, .loss = c.loss, .reduction = red};
        opt.clip = median_clip(m, bt, opt);
        const auto ref = dp_reference(m, bt.x, bt.y, opt);
        for (const std::string& mode : kModes) {
          const std::string what = label(c, dt, mode, red);
          SCOPED_TRACE(what);
          dp::Model gm(blas, m);
          const dp::Grads got = gm.compute(x, y, mode, opt);
          const meshtest::dp::DpGrads cpu = PrivateModel(m, mode, opt).compute(bt.x, bt.y);
          expect_grads(cpu, got, dt, n, what + " vs the CPU mode",
                       worst[fmt::format("{} {} vs the CPU mode", dt, mode)]);
          if (mode != "non_private") {
            // The reference (each sample's gradients alone, the model's dtype): another order.
            const meshtest::dp::DpGrads r{.norms = as_tensor(ref.norms).astype(dt),
                                          .coef = as_tensor(ref.coef).astype(dt),
                                          .grads = ref.clipped,
                                          .loss = cpu.loss};
            expect_grads(r, got, dt, n, what + " vs the reference",
                         worst[fmt::format("{} {} vs the reference", dt, mode)]);
          }
        }
      }
    }
  }
  // The table of the closing notes: the largest error / bound over the models and reductions.
  std::string table = "GPU DP modes, largest error / bound: norms, coef, grads, loss\n";
  for (const auto& [row, w] : worst) {
    table += fmt::format("  {:<40} {:.3g} {:.3g} {:.3g} {:.3g}\n", row, w[0], w[1], w[2], w[3]);
  }
  std::cout << table;
}

TEST(GpuDpModes, FusedWithoutClippingIsOnePassAndEqualsNonPrivate) {
  // No sample clipped (C far above every norm): fused keeps its first pass's gradients, which
  // equal non_private's (mean reduction, c_i = 1).
  Blas blas;
  const ModelCase c = kModels[2];
  const Sequential m = meshtest::dp::parse_model(c.spec, c.din, DType::f64, {.seed = 9});
  const Batch bt = make_batch(m, c, DType::f64, 10);
  const DeviceTensor x = DeviceTensor::from_host(bt.x), y = DeviceTensor::from_host(bt.y);
  const DpOptions opt{.clip = 1e6, .loss = c.loss};
  const DpTerms n = dp_terms(m, bt.x);
  dp::Model a(blas, m), b(blas, m);
  const dp::Grads fused = a.compute(x, y, "fused", opt);
  const dp::Grads plain = b.compute(x, y, "non_private", opt);
  for (std::int64_t i = 0; i < c.batch; ++i) EXPECT_EQ(fused.coef.data<double>()[i], 1.0) << i;
  for (std::size_t p = 0; p < plain.grads.size(); ++p) {
    expect_within(plain.grads[p].to_host(), fused.grads[p].to_host(),
                  {.dtype = DType::f64, .terms = n.clipped}, fmt::format("param {}", p));
  }
}

TEST(GpuDpModes, TenSgdStepsKeepTheCpusParametersInEveryMode) {
  // 10 steps of SGD (lr 0.05) on fresh batches, GPU against CPU, f64 and f32: each step adds lr
  // times a clipped sum with n.clipped terms to every parameter, and a parameter's difference
  // feeds the next steps through a gradient whose Lipschitz factor times lr is small here; the
  // bound counts the 10 steps' sums (10 n.clipped terms) on the scale of the parameters.
  Blas blas;
  const ModelCase c = kModels[1];
  for (const DType dt : {DType::f64, DType::f32}) {
    const Sequential m0 = meshtest::dp::parse_model(c.spec, c.din, dt, {.seed = 13});
    const DpTerms n = dp_terms(m0, make_batch(m0, c, dt, 300).x);
    std::vector<std::vector<Tensor>> finals;
    for (const std::string& mode : kModes) {
      SCOPED_TRACE(fmt::format("{} {}", dt, mode));
      const DpOptions opt{.clip = 0.2, .loss = c.loss};
      PrivateModel cpu(m0, mode, opt);
      meshtest::dp::Optimizer sgd({.kind = meshtest::dp::OptimizerKind::sgd, .lr = 0.05});
      dp::Model gm(blas, m0);
      for (int step = 0; step < 10; ++step) {
        const Batch bt = make_batch(m0, c, dt, 300 + static_cast<std::uint64_t>(step));
        const meshtest::dp::DpGrads g = cpu.compute(bt.x, bt.y);
        sgd.next_step();
        auto params = cpu.model().parameters();
        for (std::size_t p = 0; p < params.size(); ++p) sgd.update(p, params[p]->value, g.grads[p]);
        const dp::Grads gg =
            gm.compute(DeviceTensor::from_host(bt.x), DeviceTensor::from_host(bt.y), mode, opt);
        gm.sgd_step(gg.grads, 0.05);
      }
      const auto want = cpu.model().parameters();
      const std::vector<Tensor> got = gm.parameters();
      ASSERT_EQ(got.size(), want.size());
      const ErrorModel steps{.dtype = dt, .terms = 10 * n.clipped};
      for (std::size_t p = 0; p < got.size(); ++p) {
        expect_within(want[p]->value, got[p], steps, want[p]->name);
      }
      finals.push_back(got);
    }
    // Every private mode against hooks (per-sample gradients instantiated), on the GPU.
    for (std::size_t k = 2; k < finals.size(); ++k) {
      for (std::size_t p = 0; p < finals[k].size(); ++p) {
        expect_within(finals[1][p], finals[k][p], {.dtype = dt, .terms = 10 * n.clipped},
                      fmt::format("{} {} vs hooks, param {}", dt, kModes[k], p));
      }
    }
  }
}

TEST(GpuDpModes, BadInputIsAnErrorNamingIt) {
  Blas blas;
  const Sequential m = meshtest::dp::parse_model("linear:3,relu,linear:2", 4, DType::f32);
  dp::Model gm(blas, m);
  const DeviceTensor x({5, 4}, DType::f32), y({5, 2}, DType::f32);
  expect_error([&] { (void)gm.compute(x, y, "nope", {}); }, {"unknown DP mode 'nope'"});
  expect_error([&] { (void)gm.compute(x, y, "hooks", {.clip = 0}); }, {"clip"});
  expect_error(
      [&] {
        (void)gm.compute(DeviceTensor({5, 4}, DType::f64), y, "hooks", {});
      },
      {"gpu DP step: inputs are f64 but the model is f32"});
  expect_error(
      [&] {
        (void)gm.compute(DeviceTensor({5, 3}, DType::f32), y, "hooks", {});
      },
      {"input has 3 features, expected 4"});
  expect_error(
      [&] {
        (void)gm.compute(x, DeviceTensor({5, 3}, DType::f32), "ghost", {});
      },
      {"gpu DP step: mse targets are", "expected f32[5, 2]"});
  const Tensor classes = Tensor::from_vector(Shape{5}, std::vector<std::int64_t>{0, 1, 2, 1, 0});
  expect_error(
      [&] {
        (void)gm.compute(x, DeviceTensor::from_host(classes), "fused", {.loss = LossKind::ce});
      },
      {"gpu DP step: target 2 at row 2 is outside [0, 2)"});
  expect_error([&] { gm.sgd_step({}, 0.1); },
               {"gpu dp::Model::sgd_step: gradient 0 does not match parameter"});
}

}  // namespace
}  // namespace meshtest::gpu
