// DP modes: the registry, wrapping, and every private mode against the one-sample-at-a-time
// reference (norms, clip coefficients, clipped sums) over models, losses and reductions.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/dp/dp_sgd.hpp"
#include "src/dp/modes.hpp"
#include "src/dp/real.hpp"
#include "tests/support/dp_mode_cases.hpp"
#include "tests/support/dp_reference.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::dp {
namespace test_dp_modes {

using test_support::as_tensor;
using test_support::coef_scale;
using test_support::dp_reference;
using test_support::dp_terms;
using test_support::DpTerms;
using test_support::expect_error;
using test_support::expect_within;

const std::vector<std::string> kPrivate = {"hooks", "ghost", "fused", "fused_bk"};

using Batch = test_support::DpBatch;
using ModelCase = test_support::DpModelCase;
using test_support::median_clip;

Batch make_batch(const Sequential& m, std::int64_t b, std::int64_t t, std::int64_t din,
                 LossKind loss, DType dt, std::uint64_t seed) {
  return test_support::make_dp_batch(m, b, t, din, loss, dt, seed);
}

const std::vector<ModelCase>& kModels = test_support::dp_model_cases();

std::string label(const ModelCase& c, const std::string& mode, Reduction r) {
  return fmt::format("{} din={} B={} T={} loss={} reduction={} mode={}", c.spec, c.din, c.batch,
                     c.seq, loss_name(c.loss), reduction_name(r), mode);
}

// Expects `got` within the error model of `want`: the same computation in `dt` in another
// order, `terms` per element (dp_terms), with the tensor's scale max |want| unless `scale` is
// given per element.
void expect_model(const Tensor& want, const Tensor& got, DType dt, std::int64_t terms,
                  const std::string& what, const Tensor* scale = nullptr) {
  expect_within(want, got, {.dtype = dt, .terms = terms}, what,
                scale != nullptr ? std::optional<Tensor>(*scale) : std::nullopt);
}

// A mode's norms, clip coefficients and clipped sum against the reference, f64.
void expect_matches_reference(const DpGrads& g, const test_support::DpReference& ref,
                              const DpTerms& n, const std::string& l) {
  const ErrorModel norm{.dtype = DType::f64, .terms = n.norm};
  const ErrorModel clipped{.dtype = DType::f64, .terms = n.clipped};
  expect_within(as_tensor(ref.norms), g.norms, norm, l + " norms");
  expect_within(as_tensor(ref.coef), g.coef, norm, l + " coef", coef_scale(ref));
  ASSERT_EQ(g.grads.size(), ref.clipped.size()) << l;
  for (std::size_t p = 0; p < g.grads.size(); ++p) {
    expect_within(ref.clipped[p], g.grads[p], clipped, l + " param " + std::to_string(p));
  }
}

TEST(TestGradSampleModuleFSDPFuse, GsmClassRegistration) {
  EXPECT_EQ(mode_names(),
            (std::vector<std::string>{"fused", "fused_bk", "ghost", "hooks", "non_private"}));
  EXPECT_EQ(find_mode("fused_bk").name, "fused_bk");
  EXPECT_TRUE(find_mode("fused").fused_layers);
  EXPECT_FALSE(find_mode("ghost").fused_layers);
  expect_error([] { find_mode("flash_fsdp"); },
               {"unknown DP mode 'flash_fsdp'", "fused, fused_bk, ghost, hooks, non_private"});
  expect_error(
      [] {
        register_mode({"ghost", "again", false, find_mode("ghost").run});
      },
      {"already registered"});
  register_mode({"ghost_alias", "ghost under another name", false, find_mode("ghost").run});
  EXPECT_EQ(find_mode("ghost_alias").summary, "ghost under another name");
}

TEST(TestGradSampleModuleFSDPFuse, EveryModeWrapsAModel) {
  const Sequential m = parse_model("linear:6,relu,linear:4", 5, DType::f64, {.seed = 1});
  for (const char* mode : {"non_private", "hooks", "ghost", "fused", "fused_bk"}) {
    PrivateModel pm(m, mode, {});
    EXPECT_EQ(pm.mode().name, mode);
    EXPECT_EQ(fused_modules(pm.model()).size(), find_mode(mode).fused_layers ? 2u : 0u) << mode;
    for (std::size_t i = 0; i < m.parameters().size(); ++i) {
      EXPECT_TRUE(pm.model().parameters()[i]->value.bitwise_equal(m.parameters()[i]->value))
          << mode;
    }
  }
  expect_error([&] { PrivateModel(m, "flash", {}); }, {"unknown DP mode 'flash'"});
}

TEST(TestPerformanceComparison, AllModesConsistency) {
  // Every private mode's norms, clip coefficients and clipped sum against the reference built
  // from each sample's gradient alone, f64, within the error model of the same computation in
  // another order (dp_terms).
  for (const ModelCase& c : kModels) {
    const Sequential m = parse_model(c.spec, c.din, DType::f64, {.seed = 7});
    const Batch bt = make_batch(m, c.batch, c.seq, c.din, c.loss, DType::f64, 8);
    const DpTerms n = dp_terms(m, bt.x);
    for (Reduction red : {Reduction::mean, Reduction::sum}) {
      DpOptions opt{.clip = 1, .loss = c.loss, .reduction = red};
      opt.clip = median_clip(m, bt, opt);
      const auto ref = dp_reference(m, bt.x, bt.y, opt);
      for (const std::string& mode : kPrivate) {
        PrivateModel pm(m, mode, opt);
        expect_matches_reference(pm.compute(bt.x, bt.y), ref, n, label(c, mode, red));
      }
    }
  }
}

TEST(TestPerformanceComparison, AllModesConsistencyF32) {
  const ModelCase c = kModels[1];
  const Sequential m64 = parse_model(c.spec, c.din, DType::f64, {.seed = 7});
  const Sequential m32 = parse_model(c.spec, c.din, DType::f32, {.seed = 7});
  const Batch b64 = make_batch(m64, c.batch, 5, c.din, c.loss, DType::f64, 8);
  const Batch b32{.x = b64.x.astype(DType::f32), .y = b64.y};
  DpOptions opt{.clip = 1, .loss = c.loss, .reduction = Reduction::mean};
  opt.clip = median_clip(m32, b32, opt);
  const auto ref = dp_reference(m32, b32.x, b32.y, opt);
  // The reference's per-sample gradients are the f32 model's too: f32 in another order.
  const DpTerms n = dp_terms(m32, b32.x);
  for (const std::string& mode : kPrivate) {
    const DpGrads g = PrivateModel(m32, mode, opt).compute(b32.x, b32.y);
    expect_model(as_tensor(ref.norms), g.norms, DType::f32, n.norm, mode + " norms");
    for (std::size_t p = 0; p < g.grads.size(); ++p) {
      expect_model(ref.clipped[p], g.grads[p], DType::f32, n.clipped,
                   mode + " param " + std::to_string(p));
    }
  }
}

TEST(TestPerformanceComparison, FuseBkLossReductionModes) {
  // Norms are those of each sample's own loss under both reductions; mean = sum / B.
  const ModelCase c = kModels[0];
  const Sequential m = parse_model(c.spec, c.din, DType::f64, {.seed = 3});
  const Batch bt = make_batch(m, c.batch, c.seq, c.din, c.loss, DType::f64, 4);
  // The mean's chain runs on gradients scaled by 1 / B: every rounding may fall otherwise.
  const DpTerms n = dp_terms(m, bt.x);
  for (const std::string& mode : kPrivate) {
    const DpGrads mean =
        PrivateModel(m, mode, {.clip = 0.5, .reduction = Reduction::mean}).compute(bt.x, bt.y);
    const DpGrads sum =
        PrivateModel(m, mode, {.clip = 0.5, .reduction = Reduction::sum}).compute(bt.x, bt.y);
    expect_model(sum.norms, mean.norms, DType::f64, n.norm, mode + " norms");
    for (std::size_t p = 0; p < sum.grads.size(); ++p) {
      Tensor scaled = sum.grads[p];
      scaled.vector<double>() /= static_cast<double>(c.batch);
      expect_model(scaled, mean.grads[p], DType::f64, n.clipped,
                   mode + " param " + std::to_string(p));
    }
  }
}

TEST(TestPerformanceComparison, FusedWithoutClippingEqualsNonPrivate) {
  // A large C clips nothing: fused uses its first pass's fused gradients; all equal non_private.
  for (const ModelCase& c : {kModels[2], kModels[0]}) {
    const Sequential m = parse_model(c.spec, c.din, DType::f64, {.seed = 5});
    const Batch bt = make_batch(m, c.batch, c.seq, c.din, c.loss, DType::f64, 6);
    const DpOptions opt{.clip = 1e6, .loss = c.loss};
    const DpGrads plain = PrivateModel(m, "non_private", opt).compute(bt.x, bt.y);
    EXPECT_TRUE(is_unset(plain.norms) || plain.norms.numel() == 0);
    // Per-sample sums (every c_i = 1) against the batch's: the clipped sum's chain.
    const DpTerms n = dp_terms(m, bt.x);
    for (const std::string& mode : kPrivate) {
      const DpGrads g = PrivateModel(m, mode, opt).compute(bt.x, bt.y);
      for (std::size_t p = 0; p < g.grads.size(); ++p) {
        expect_model(plain.grads[p], g.grads[p], DType::f64, n.clipped,
                     c.spec + " " + mode + " param " + std::to_string(p));
      }
    }
  }
}

TEST(TestGradSampleModuleFSDPFuse, ForwardBackwardNormsAndClippingCoef) {
  // A training loop (SGD): at every step, each mode's norms and coefficients equal the
  // reference on the model's current weights.
  const ModelCase c = kModels[3];
  const Sequential m = parse_model(c.spec, c.din, DType::f64, {.seed = 9});
  for (const std::string& mode : kPrivate) {
    DpSgd opt(m, {.mode = mode,
                  .dp = {.clip = 0.3, .loss = c.loss},
                  .noise = {},
                  .optimizer = {.lr = 0.05}});
    for (int step = 0; step < 3; ++step) {
      const Batch bt = make_batch(m, c.batch, c.seq, c.din, c.loss, DType::f64, 100 + step);
      const auto ref = dp_reference(opt.model(), bt.x, bt.y, {.clip = 0.3, .loss = c.loss});
      const std::int64_t n = dp_terms(opt.model(), bt.x).norm;
      const StepReport r = opt.step(bt.x, bt.y);
      const std::string l = mode + " step " + std::to_string(step);
      expect_model(as_tensor(ref.norms), r.norms, DType::f64, n, l + " norms");
      const Tensor cs = coef_scale(ref);
      expect_model(as_tensor(ref.coef), r.coef, DType::f64, n, l + " coef", &cs);
    }
  }
}

TEST(TestPerformanceComparison, FuseBkMultipleIterations) {
  // 10 DP-SGD steps with noise and Adam: every private mode keeps the same parameters as
  // hooks (per-sample gradients instantiated), and the first step equals a by-hand SGD step.
  const ModelCase c = kModels[1];
  const Sequential m = parse_model(c.spec, c.din, DType::f64, {.seed = 13});
  const DpSgdOptions base{.mode = "hooks",
                          .dp = {.clip = 0.2, .loss = c.loss},
                          .noise = {.sigma = 0.7, .seed = 42},
                          .optimizer = {.kind = OptimizerKind::adam, .lr = 0.01}};
  std::vector<Sequential> finals;
  for (const std::string& mode : kPrivate) {
    DpSgdOptions o = base;
    o.mode = mode;
    DpSgd run(m, o);
    for (int step = 0; step < 10; ++step) {
      const Batch bt = make_batch(m, c.batch, c.seq, c.din, c.loss, DType::f64, 200 + step);
      run.step(bt.x, bt.y);
    }
    finals.push_back(run.model());
  }
  // Not the error model: Adam divides each update by sqrt(v) ~ |g|, so a gradient's rounding
  // error dg moves its parameter by lr dg / |g|, unbounded by a sum's error where |g| is small.
  // With dg ~ 1e-14 max |g| (f64, this model's chains), 1e-10 of max |w| ~ 0.5 holds for every
  // |g| down to ~1e-5 of max |g|, which the noise (sigma C / B ~ 0.035 per element) keeps.
  for (std::size_t k = 1; k < finals.size(); ++k) {
    const auto want = finals[0].parameters();
    const auto got = finals[k].parameters();
    for (std::size_t p = 0; p < want.size(); ++p) {
      EXPECT_LE(test_support::rel_err(got[p]->value, want[p]->value), 1e-10)
          << kPrivate[k] << " " << want[p]->name;
    }
  }
}

TEST(TestPerformanceComparison, OneSgdStepByHand) {
  const ModelCase c = kModels[0];
  const Sequential m = parse_model(c.spec, c.din, DType::f64, {.seed = 17});
  const Batch bt = make_batch(m, c.batch, c.seq, c.din, c.loss, DType::f64, 18);
  const double lr = 0.1, sigma = 0.5, clip = 0.4;
  const auto ref = dp_reference(m, bt.x, bt.y, {.clip = clip});
  DpSgd run(m, {.mode = "fused_bk",
                .dp = {.clip = clip},
                .noise = {.sigma = sigma, .seed = 3},
                .optimizer = {.lr = lr}});
  run.step(bt.x, bt.y);
  const auto before = m.parameters();
  const auto after = run.model().parameters();
  const std::int64_t n = dp_terms(m, bt.x).clipped;
  for (std::size_t p = 0; p < before.size(); ++p) {
    Tensor want = before[p]->value;
    const RandomKey key{.seed = 3, .stream = p};  // step 0: stream = (0 << 32) | p
    for (std::int64_t j = 0; j < want.numel(); ++j) {
      const double noisy = ref.clipped[p].item(j) + sigma * clip * normal_at(key, j) / c.batch;
      want.data<double>()[j] -= lr * noisy;
    }
    // The clipped sum's chain. The terms: w and lr times the noisy sum (whose noise, sigma C z /
    // B, is the same on both sides but for its roundings).
    const ErrorModel em{.dtype = DType::f64, .terms = n};
    const double scale = test_support::max_abs(before[p]->value) +
                         lr * (test_support::max_abs(ref.clipped[p]) + sigma * clip);
    const Comparison r = compare(want, after[p]->value, em, scale);
    EXPECT_TRUE(r.passed) << before[p]->name << ": " << r;
  }
}

TEST(TestPerformanceComparison, GradientsMatchFiniteDifferences) {
  // The model's backward (Linear, GELU, ReLU, RMSNorm, mse and ce) against central differences.
  for (const ModelCase& c : kModels) {
    Sequential m = parse_model(c.spec, c.din, DType::f64, {.seed = 21});
    const Batch bt = make_batch(m, 2, c.seq, c.din, c.loss, DType::f64, 22);
    const DpOptions opt{.loss = c.loss, .reduction = Reduction::sum};
    const DpGrads g = PrivateModel(m, "non_private", opt).compute(bt.x, bt.y);
    const auto params = m.parameters();
    for (std::size_t p = 0; p < params.size(); ++p) {
      for (std::int64_t j = 0; j < params[p]->value.numel(); j += 3) {
        const double v = params[p]->value.item(j), h = 1e-5;
        params[p]->value.data<double>()[j] = v + h;
        const double lp = PrivateModel(m, "non_private", opt).compute(bt.x, bt.y).loss;
        params[p]->value.data<double>()[j] = v - h;
        const double lm = PrivateModel(m, "non_private", opt).compute(bt.x, bt.y).loss;
        params[p]->value.data<double>()[j] = v;
        // Central differences at h = 1e-5 in f64: truncation h^2 |f^(3)| / 6 ~ 2e-11 |f^(3)| and
        // cancellation u |loss| / h ~ 1e-11 |loss|; 1e-6 leaves 1e4x for both.
        EXPECT_NEAR(g.grads[p].item(j), (lp - lm) / (2 * h),
                    1e-6 * (1 + std::abs(g.grads[p].item(j))))
            << c.spec << " " << params[p]->name << "[" << j << "]";
      }
    }
  }
}

TEST(TestPerformanceComparison, EmptyBatch) {
  // B = 0: no norms, zero clipped sum, noise still added, nothing divided by zero.
  const Sequential m = parse_model("linear:3,relu,linear:2", 4, DType::f64, {.seed = 1});
  for (const std::string& mode : kPrivate) {
    const DpGrads g = PrivateModel(m, mode, {})
                          .compute(Tensor({0, 5, 4}, DType::f64), Tensor({0, 5, 2}, DType::f64));
    EXPECT_EQ(g.norms.shape(), Shape{0});
    for (const Tensor& t : g.grads) EXPECT_EQ(test_support::sum_sq(t), 0.0) << mode;
    DpSgd run(m, {.mode = mode, .dp = {}, .noise = {.sigma = 1.0, .seed = 1}, .optimizer = {}});
    run.step(Tensor({0, 4}, DType::f64), Tensor({0, 2}, DType::f64));
    const auto before = m.parameters();
    const auto after = run.model().parameters();
    const RandomKey key{.seed = 1, .stream = 0};
    // w - lr z: one or two roundings (an FMA may fuse them); EXPECT_DOUBLE_EQ allows 4 ulps.
    EXPECT_DOUBLE_EQ(after[0]->value.item(0), before[0]->value.item(0) - 0.1 * normal_at(key, 0))
        << mode;
  }
}

TEST(TestPerformanceComparison, BadInput) {
  const Sequential m = parse_model("linear:3,relu,linear:2", 4, DType::f64, {.seed = 1});
  const Tensor x = random_normal({3, 2, 4}, DType::f64, {.seed = 1});
  const Tensor y = random_normal({3, 2, 2}, DType::f64, {.seed = 2});
  expect_error([&] { PrivateModel(m, "hooks", {.clip = 0}); }, {"C > 0"});
  expect_error([&] { PrivateModel(m, "hooks", {.clip = -1}); }, {"C > 0"});
  expect_error(
      [&] { DpSgd(m, {.mode = "hooks", .dp = {}, .noise = {.sigma = -1}, .optimizer = {}}); },
      {"sigma >= 0"});
  PrivateModel pm(m, "fused_bk", {});
  expect_error(
      [&] {
        pm.compute(Tensor({3, 0, 4}, DType::f64), Tensor({3, 0, 2}, DType::f64));
      },
      {"T = 0"});
  expect_error(
      [&] {
        pm.compute(random_normal({3, 2, 5}, DType::f64, {}), y);
      },
      {"input has 5 features, expected 4"});
  expect_error([&] { pm.compute(x, y.slice(2, 0, 1)); }, {"mse targets", "f64[3, 2, 2]"});
  expect_error([&] { pm.compute(x.astype(DType::f32), y); },
               {"inputs are f32 but the model is f64"});
  PrivateModel ce(m, "ghost", {.loss = LossKind::ce});
  expect_error(
      [&] {
        ce.compute(x, random_integers({3, 2}, DType::i64, {}, 0, 5));
      },
      {"outside [0, 2)"});
  expect_error([&] { ce.compute(x, y); }, {"ce targets"});
  expect_error([] { loss_from_name("l1"); }, {"unknown loss 'l1'"});
  expect_error([] { reduction_from_name("avg"); }, {"unknown loss reduction 'avg'"});
}

}  // namespace test_dp_modes
}  // namespace meshtest::dp
