// Value metrics comparing an expected tensor with a computed one: pcc, allclose, nmse, max errors.
#include "src/check/metrics.hpp"

#include <algorithm>
#include <cmath>

namespace meshtest {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void check_same_size(std::string_view what, const Eigen::ArrayXd& expected,
                     const Eigen::ArrayXd& got) {
  MESHTEST_CHECK(expected.size() == got.size(),
                 "{}: sizes differ: expected has {} elements, got has {}", what, expected.size(),
                 got.size());
}

bool is_constant(const Eigen::ArrayXd& a) { return (a == a(0)).all(); }

/// Largest |value| over both arrays when it is finite and non-zero, else 1: dividing by it keeps
/// sums of squares from overflowing without changing scale-invariant metrics.
double common_scale(const Eigen::ArrayXd& a, const Eigen::ArrayXd& b) {
  if (a.size() == 0) {
    return 1.0;
  }
  const double s = std::max(a.abs().maxCoeff(), b.abs().maxCoeff());
  return std::isfinite(s) && s > 0 ? s : 1.0;
}

}  // namespace

void check_same_shape(std::string_view what, const Tensor& expected, const Tensor& got) {
  MESHTEST_CHECK(expected.shape() == got.shape(), "{}: shapes differ: expected {}, got {}", what,
                 describe(expected), describe(got));
}

Eigen::ArrayXd to_f64(const Tensor& t) {
  return visit_dtype(t.dtype(), [&]<class T>(type_tag<T>) -> Eigen::ArrayXd {
    return t.vector<T>().template cast<double>().array();
  });
}

double abs_error(double expected, double got) {
  if (expected == got) {
    return 0.0;
  }
  const bool nan_e = std::isnan(expected), nan_g = std::isnan(got);
  if (nan_e && nan_g) {
    return 0.0;
  }
  if (nan_e || nan_g || std::isinf(expected) || std::isinf(got)) {
    return kInf;
  }
  return std::abs(got - expected);
}

bool is_close(double expected, double got, const Tolerance& tol) {
  const bool nan_e = std::isnan(expected), nan_g = std::isnan(got);
  if (nan_e || nan_g) {
    return tol.equal_nan && nan_e && nan_g;
  }
  if (std::isinf(expected) || std::isinf(got)) {
    return expected == got;
  }
  return std::abs(got - expected) <= tol.atol + tol.rtol * std::abs(expected);
}

double pcc(const Tensor& expected, const Tensor& got) {
  check_same_shape("pcc", expected, got);
  return pcc(to_f64(expected), to_f64(got));
}

double pcc(const Eigen::ArrayXd& expected, const Eigen::ArrayXd& got) {
  check_same_size("pcc", expected, got);
  // all() of an empty array is true, so two empty inputs end here with 1.
  const bool all_nan_e = expected.isNaN().all(), all_nan_g = got.isNaN().all();
  if (all_nan_e && all_nan_g) {
    return 1.0;
  }
  if (all_nan_e || all_nan_g) {
    return 0.0;
  }

  const Eigen::ArrayXd e = expected.isFinite().select(expected, 0.0);
  const Eigen::ArrayXd g = got.isFinite().select(got, 0.0);
  if ((e != 0.0).any() != (g != 0.0).any()) {
    return 0.0;
  }
  if ((e == g).all()) {
    return 1.0;
  }
  // Not equal, so a constant input has zero variance and no correlation to report.
  if (is_constant(e) || is_constant(g)) {
    return 0.0;
  }

  const double s = common_scale(e, g);
  const double mean_e = (e / s).mean(), mean_g = (g / s).mean();
  double see = 0.0, sgg = 0.0, seg = 0.0;  // centred sums of squares and products
  for (Eigen::Index i = 0; i < e.size(); ++i) {
    const double de = e(i) / s - mean_e, dg = g(i) / s - mean_g;
    see += de * de;
    sgg += dg * dg;
    seg += de * dg;
  }
  const double r = seg / std::sqrt(see * sgg);
  return std::clamp(r, -1.0, 1.0);
}

bool allclose(const Tensor& expected, const Tensor& got, double rtol, double atol, bool equal_nan) {
  return allclose(expected, got, Tolerance{.rtol = rtol, .atol = atol, .equal_nan = equal_nan});
}

bool allclose(const Tensor& expected, const Tensor& got, const Tolerance& tol) {
  check_same_shape("allclose", expected, got);
  return count_not_close(to_f64(expected), to_f64(got), tol) == 0;
}

std::int64_t count_not_close(const Eigen::ArrayXd& expected, const Eigen::ArrayXd& got,
                             const Tolerance& tol) {
  check_same_size("allclose", expected, got);
  std::int64_t n = 0;
  for (Eigen::Index i = 0; i < expected.size(); ++i) {
    n += is_close(expected(i), got(i), tol) ? 0 : 1;
  }
  return n;
}

double nmse(const Tensor& expected, const Tensor& got) {
  check_same_shape("nmse", expected, got);
  return nmse(to_f64(expected), to_f64(got));
}

double nmse(const Eigen::ArrayXd& expected, const Eigen::ArrayXd& got) {
  check_same_size("nmse", expected, got);
  const double s = common_scale(expected, got);
  const double err = ((got - expected) / s).square().sum();
  const double ref = (expected / s).square().sum();
  if (ref == 0.0) {
    return err == 0.0 ? 0.0 : (std::isnan(err) ? err : kInf);
  }
  return err / ref;
}

double max_abs_error(const Tensor& expected, const Tensor& got) {
  check_same_shape("max_abs_error", expected, got);
  return max_abs_error(to_f64(expected), to_f64(got));
}

double max_abs_error(const Eigen::ArrayXd& expected, const Eigen::ArrayXd& got) {
  check_same_size("max_abs_error", expected, got);
  double worst = 0.0;
  for (Eigen::Index i = 0; i < expected.size(); ++i) {
    worst = std::max(worst, abs_error(expected(i), got(i)));
  }
  return worst;
}

double max_rel_error(const Tensor& expected, const Tensor& got) {
  check_same_shape("max_rel_error", expected, got);
  return max_rel_error(to_f64(expected), to_f64(got));
}

double max_rel_error(const Eigen::ArrayXd& expected, const Eigen::ArrayXd& got) {
  check_same_size("max_rel_error", expected, got);
  double worst = 0.0;
  for (Eigen::Index i = 0; i < expected.size(); ++i) {
    const double d = abs_error(expected(i), got(i));
    // Zero and infinite errors skip the division (Inf / Inf would be NaN).
    const double rel =
        (d == 0.0 || std::isinf(d)) ? d : d / std::max(std::abs(expected(i)), kRelErrorFloor);
    worst = std::max(worst, rel);
  }
  return worst;
}

}  // namespace meshtest
