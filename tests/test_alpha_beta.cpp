// The α-β fit of bench/alpha_beta.hpp against times made from known α and β.
#include "bench/alpha_beta.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "tests/support/expect_error.hpp"

namespace meshtest::bench {
namespace test_alpha_beta {

using test_support::expect_error;

TEST(AlphaBeta, RecoversExactModel) {
  // Ring all_reduce on 4 ranks: steps 2(p-1) = 6, bytes 2(p-1)/p·S = 1.5 S.
  const double alpha = 5e-6, beta = 1.0 / 2e9;
  std::vector<AlphaBetaSample> s;
  for (double bytes = 65536; bytes <= 32 << 20; bytes *= 2) {
    s.push_back({.steps = 6, .bytes_term = 1.5 * bytes, .seconds = alpha * 6 + beta * 1.5 * bytes});
  }
  const AlphaBeta m = fit_alpha_beta(s);
  // Exact samples: the QR fit errs by ~cond · u (~1e-14 relative here, in any order of its few
  // sums); 1e-9, 1e-12 and 1e-15 (~5000 ulps of the prediction) are far above it.
  EXPECT_NEAR(m.alpha, alpha, 1e-9 * alpha);
  EXPECT_NEAR(m.beta, beta, 1e-9 * beta);
  EXPECT_LT(m.rel_rms, 1e-12);
  EXPECT_NEAR(m.predict(62, 31.0 / 16 * 1e6), alpha * 62 + beta * 31.0 / 16 * 1e6, 1e-15);
}

TEST(AlphaBeta, WeighsRelativeError) {
  // Three exact samples of t = 1 + S (α = 1 per step, β = 1) and one 10 % off: the relative
  // fit leaves the small exact samples almost exact, so α stays near 1.
  std::vector<AlphaBetaSample> s{{1, 0, 1}, {1, 1, 2}, {1, 2, 3}, {1, 1000, 1001 * 1.1}};
  const AlphaBeta m = fit_alpha_beta(s);
  EXPECT_NEAR(m.alpha, 1.0, 0.05);
  EXPECT_GT(m.rel_rms, 0.0);
}

TEST(AlphaBeta, NeverNegative) {
  // t = S exactly, plus a small message that came out too fast: the unconstrained fit gives a
  // negative α; the fit clamps it to 0 and fits β alone: minimize (β - 1)² + (10β/5 - 1)²,
  // i.e. β = (1 + 2) / (1 + 4) = 0.6.
  const std::vector<AlphaBetaSample> s{{1, 100, 100}, {1, 10, 5}};
  const AlphaBeta m = fit_alpha_beta(s);
  EXPECT_EQ(m.alpha, 0.0);
  EXPECT_NEAR(m.beta, 0.6, 1e-12);
}

TEST(AlphaBeta, BadInput) {
  const std::vector<AlphaBetaSample> one{{1, 1, 1}};
  expect_error([&] { fit_alpha_beta(one); }, {"need at least 2"});
  const std::vector<AlphaBetaSample> zero{{1, 1, 1}, {1, 2, 0}};
  expect_error([&] { fit_alpha_beta(zero); }, {"positive finite time"});
  const std::vector<AlphaBetaSample> collinear{{1, 2, 1}, {2, 4, 2}};
  expect_error([&] { fit_alpha_beta(collinear); }, {"measure at least two message sizes"});
}

}  // namespace test_alpha_beta
}  // namespace meshtest::bench
