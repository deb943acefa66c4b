// The α-β (latency-bandwidth) model of a collective: t = α·steps(p) + β·bytes_term(S, p),
// fitted to measured times by weighted least squares (Eigen) and projected to other rank counts.
#pragma once

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <span>

#include "src/core/error.hpp"

namespace meshtest::bench {

/// One measurement: the model's two regressors and the measured time.
struct AlphaBetaSample {
  double steps = 0;       ///< latency term: message steps of the algorithm (ring: p-1, ...)
  double bytes_term = 0;  ///< bandwidth term: bytes each device moves (ring all_reduce: 2(p-1)/p·S)
  double seconds = 0;     ///< measured time
};

/// A fitted model: t = alpha·steps + beta·bytes_term.
struct AlphaBeta {
  double alpha = 0;    ///< seconds per step
  double beta = 0;     ///< seconds per byte (1/beta is the link bandwidth)
  double rel_rms = 0;  ///< root mean square of (model - measured) / measured over the samples

  /// The model's time for a call.
  double predict(double steps, double bytes_term) const {
    return alpha * steps + beta * bytes_term;
  }
};

/// Fits α >= 0 and β >= 0 minimizing the relative error sum_i ((α·s_i + β·b_i - t_i) / t_i)²,
/// so small messages (which fix α) weigh as much as large ones (which fix β). Needs at least two
/// samples with positive times that do not all share one ratio bytes_term / steps; throws Error
/// otherwise.
inline AlphaBeta fit_alpha_beta(std::span<const AlphaBetaSample> samples) {
  const auto n = static_cast<Eigen::Index>(samples.size());
  MESHTEST_CHECK(n >= 2, "fit_alpha_beta: {} samples; need at least 2", n);
  Eigen::MatrixXd a(n, 2);
  Eigen::VectorXd t(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    const AlphaBetaSample& s = samples[static_cast<std::size_t>(i)];
    MESHTEST_CHECK(s.seconds > 0 && std::isfinite(s.seconds),
                   "fit_alpha_beta: sample {} has time {}; need a positive finite time", i,
                   s.seconds);
    a(i, 0) = s.steps / s.seconds;
    a(i, 1) = s.bytes_term / s.seconds;
    t(i) = 1.0;
  }
  const Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(a);
  MESHTEST_CHECK(qr.rank() == 2,
                 "fit_alpha_beta: the samples do not determine both α and β (every sample has "
                 "the same bytes_term / steps ratio); measure at least two message sizes");
  Eigen::Vector2d x = qr.solve(t);
  // Times cannot have a negative part: when noise makes one coefficient negative, it is 0
  // and the other is fitted alone (the non-negative least-squares solution for two unknowns).
  for (int k = 0; k < 2; ++k) {
    if (x(k) >= 0) continue;
    const Eigen::VectorXd c = a.col(1 - k);
    x(k) = 0;
    x(1 - k) = std::max(0.0, c.sum() / c.squaredNorm());
  }
  const double rms = std::sqrt((a * x - t).squaredNorm() / static_cast<double>(n));
  return {.alpha = x(0), .beta = x(1), .rel_rms = rms};
}

}  // namespace meshtest::bench
