// DP optimizers: SGD and Adam (with bias correction) against the textbook update written out per
// element in plain scalar code, over several steps and two slots, in f64 and f32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "src/dp/optimizer.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::dp {
namespace test_dp_optimizer {

// Gradients of steps 1..3 for slot 0 (6 elements, includes 0 and sign changes) and slot 1 (3).
const std::vector<std::vector<double>> kGrad0 = {{0.5, -2.0, 0.0, 1e-3, 4.0, -0.25},
                                                 {-1.0, -2.0, 0.5, 1e-3, 0.0, 0.75},
                                                 {0.25, 3.0, -0.5, -2e-3, 1.0, 0.0}};
const std::vector<std::vector<double>> kGrad1 = {
    {1.0, 2.0, 3.0}, {0.0, -1.0, 2.0}, {5.0, 0.5, -3.0}};
const std::vector<double> kInit0 = {1.0, -1.0, 0.5, 2.0, 0.0, -0.5};
const std::vector<double> kInit1 = {0.1, 0.2, 0.3};

// Kingma & Ba, Algorithm 1, one element at a time:
//   m_t = b1 m_{t-1} + (1 - b1) g;  v_t = b2 v_{t-1} + (1 - b2) g^2
//   w_t = w_{t-1} - lr (m_t / (1 - b1^t)) / (sqrt(v_t / (1 - b2^t)) + eps)
std::vector<double> textbook_adam(std::vector<double> w,
                                  const std::vector<std::vector<double>>& grads,
                                  const OptimizerOptions& o) {
  std::vector<double> m(w.size(), 0.0), v(w.size(), 0.0);
  for (std::size_t t = 1; t <= grads.size(); ++t) {
    for (std::size_t j = 0; j < w.size(); ++j) {
      const double g = grads[t - 1][j];
      m[j] = o.beta1 * m[j] + (1 - o.beta1) * g;
      v[j] = o.beta2 * v[j] + (1 - o.beta2) * g * g;
      const double mhat = m[j] / (1 - std::pow(o.beta1, static_cast<double>(t)));
      const double vhat = v[j] / (1 - std::pow(o.beta2, static_cast<double>(t)));
      w[j] -= o.lr * mhat / (std::sqrt(vhat) + o.eps);
    }
  }
  return w;
}

std::vector<double> textbook_sgd(std::vector<double> w,
                                 const std::vector<std::vector<double>>& grads, double lr) {
  for (const auto& g : grads) {
    for (std::size_t j = 0; j < w.size(); ++j) w[j] -= lr * g[j];
  }
  return w;
}

template <class T>
Tensor make(const std::vector<double>& v, Shape shape) {
  return Tensor::from_vector(shape, std::vector<T>(v.begin(), v.end()));
}

template <class T>
void run_and_check(const OptimizerOptions& o, double tol) {
  Optimizer opt(o);
  Tensor w0 = make<T>(kInit0, {2, 3}), w1 = make<T>(kInit1, {3});
  for (std::size_t t = 0; t < kGrad0.size(); ++t) {
    opt.next_step();
    opt.update(0, w0, make<T>(kGrad0[t], {2, 3}));
    opt.update(1, w1, make<T>(kGrad1[t], {3}));
  }
  EXPECT_EQ(opt.step(), 3);
  const bool adam = o.kind == OptimizerKind::adam;
  const auto want0 = adam ? textbook_adam(kInit0, kGrad0, o) : textbook_sgd(kInit0, kGrad0, o.lr);
  const auto want1 = adam ? textbook_adam(kInit1, kGrad1, o) : textbook_sgd(kInit1, kGrad1, o.lr);
  for (std::size_t j = 0; j < want0.size(); ++j) {
    EXPECT_NEAR(w0.item(static_cast<std::int64_t>(j)), want0[j], tol) << "slot 0 element " << j;
  }
  for (std::size_t j = 0; j < want1.size(); ++j) {
    EXPECT_NEAR(w1.item(static_cast<std::int64_t>(j)), want1[j], tol) << "slot 1 element " << j;
  }
}

// Tolerances: the textbook and the optimizer do a few f64 or f32 operations per element and
// step, no sums of many terms, so they differ by a few roundings (an FMA, pow against a running
// product) on any processor. Parameters stay within |w| <= 2; each tolerance is at least 4 ulps
// of 2 in the result's dtype: f64 1e-12 (~2000 ulps, Adam's division by sqrt(v) + eps), 1e-14
// (~20 ulps, SGD's 3 updates); f32 1e-5 (~40 ulps, Adam, the gradients rounded to f32: 1e-3 is
// not a float), 1e-6 (~4 ulps, SGD: 3 updates, each rounding w by at most half an ulp, 3.6e-7
// in all at |w| = 2).
TEST(DpOptimizer, AdamMatchesTextbookF64) {
  run_and_check<double>({.kind = OptimizerKind::adam, .lr = 0.01}, 1e-12);
  run_and_check<double>(
      {.kind = OptimizerKind::adam, .lr = 0.5, .beta1 = 0.5, .beta2 = 0.75, .eps = 1e-3}, 1e-12);
}

TEST(DpOptimizer, AdamMatchesTextbookF32) {
  run_and_check<float>({.kind = OptimizerKind::adam, .lr = 0.01}, 1e-5);
}

TEST(DpOptimizer, SgdMatchesTextbook) {
  run_and_check<double>({.kind = OptimizerKind::sgd, .lr = 0.1}, 1e-14);
  run_and_check<float>({.kind = OptimizerKind::sgd, .lr = 0.1}, 1e-6);
}

// Closed form of Adam's first step: m1 = (1 - b1) g and v1 = (1 - b2) g^2, so after bias
// correction the step is lr * g / (|g| + eps), whatever b1 and b2 are.
TEST(DpOptimizer, AdamFirstStepIsSignedLr) {
  // A handful of f64 roundings of values below 1: 1e-15 is ~10 ulps of 0.4.
  Optimizer opt({.kind = OptimizerKind::adam, .lr = 0.5, .beta1 = 0.3, .beta2 = 0.6, .eps = 0.5});
  Tensor w = make<double>({0.0, 0.0, 0.0}, {3});
  opt.next_step();
  opt.update(0, w, make<double>({2.0, -0.5, 0.0}, {3}));
  EXPECT_NEAR(w.item(0), -0.5 * 2.0 / 2.5, 1e-15);
  EXPECT_NEAR(w.item(1), 0.5 * 0.5 / 1.0, 1e-15);
  EXPECT_EQ(w.item(2), 0.0);
}

TEST(DpOptimizer, BadInputNamesTheProblem) {
  Optimizer opt({.kind = OptimizerKind::adam});
  Tensor w = make<double>({1.0, 2.0}, {2});
  test_support::expect_error(
      [&] {
        opt.update(0, w, make<double>({1.0, 2.0}, {2}));
      },
      {"next_step()"});
  opt.next_step();
  test_support::expect_error(
      [&] {
        opt.update(0, w, make<double>({1.0, 2.0, 3.0}, {3}));
      },
      {"optimizer: value", "differ"});
  test_support::expect_error([] { Optimizer bad({.beta1 = 1.0}); }, {"beta1 1"});
  test_support::expect_error([] { optimizer_from_name("lamb"); }, {"'lamb'", "sgd or adam"});
}

}  // namespace test_dp_optimizer
}  // namespace meshtest::dp
