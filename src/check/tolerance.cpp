// The tolerance model: how far a result computed in another order may lie from its reference.
#include "src/check/tolerance.hpp"

#include <cmath>
#include <utility>

namespace meshtest {
namespace {

std::string_view reference_name(Reference r) {
  return r == Reference::exact ? "exact" : "other_order";
}

/// lambda * sqrt(s * (n ua^2 + r uo^2)): the bound per unit of scale.
double relative_bound(const ErrorModel& m) {
  const double ua = accumulation_roundoff(m.dtype), uo = unit_roundoff(m.dtype);
  const double sides = m.reference == Reference::exact ? 1.0 : 2.0;
  return m.lambda * std::sqrt(sides * (static_cast<double>(m.terms) * ua * ua +
                                       static_cast<double>(m.roundings) * uo * uo));
}

/// The final rounding of each side's result to dtype.
double rounding_bound(const ErrorModel& m, double expected) {
  const double sides = m.reference == Reference::exact ? 1.0 : 2.0;
  return sides * unit_roundoff(m.dtype) * std::abs(expected);
}

/// Metric::model over flat arrays, `scale_at(i)` giving element i's magnitude.
template <class ScaleAt>
Comparison compare_model(const Tensor& expected, const Tensor& got, const ErrorModel& m,
                         ScaleAt scale_at) {
  check_model(m, "compare: ErrorModel");
  check_same_shape("compare(model)", expected, got);
  const Eigen::ArrayXd e = to_f64(expected), g = to_f64(got);
  const double per_scale = relative_bound(m);
  Comparison c;
  c.shape = expected.shape();
  c.metric = "model(" + m.str() + ")";
  c.kind = Metric::model;
  c.threshold = 1;
  std::int64_t first_bad = -1;
  for (Eigen::Index i = 0; i < e.size(); ++i) {
    if (!std::isfinite(g(i)) && std::isfinite(e(i)) && c.nan_or_inf_count++ == 0) {
      first_bad = i;
    }
    const double s = scale_at(i);
    MESHTEST_CHECK(s >= 0 && std::isfinite(s), "compare(model): scale {} at element {}", s, i);
    const double err = abs_error(e(i), g(i));
    const double bound = per_scale * s + rounding_bound(m, e(i));
    // 0 / 0 = 0: an element whose terms are all 0 must be exactly 0.
    const double ratio = err == 0 ? 0.0 : err / bound;
    if (ratio > c.value || (std::isnan(ratio) && !std::isnan(c.value))) {
      c.value = ratio;
      c.worst_index = i;
    }
  }
  if (first_bad >= 0) {
    c.worst_index = first_bad;
    c.note = fmt::format("got has {} NaN/Inf where expected is finite (first at index {})",
                         c.nan_or_inf_count, first_bad);
  }
  c.passed = c.nan_or_inf_count == 0 && c.value <= 1.0;
  if (c.worst_index >= 0) {
    c.worst_coord = unravel_index(c.shape, c.worst_index);
    c.expected_at_worst = e(c.worst_index);
    c.got_at_worst = g(c.worst_index);
    if (c.passed || c.nan_or_inf_count > 0) return c;
    const double s = scale_at(c.worst_index);
    c.note = fmt::format("|error| {:.3g} > bound {:.3g} (scale {:.3g})",
                         abs_error(c.expected_at_worst, c.got_at_worst),
                         per_scale * s + rounding_bound(m, c.expected_at_worst), s);
  }
  return c;
}

}  // namespace

void check_model(const ErrorModel& m, std::string_view what) {
  MESHTEST_CHECK(is_floating(m.dtype), "{}.dtype is {}; need f32, f64, bf16 or f16", what, m.dtype);
  MESHTEST_CHECK(m.terms >= 0, "{}.terms is {}; need >= 0 (0: an empty sum, exactly 0)", what,
                 m.terms);
  MESHTEST_CHECK(m.roundings >= 0, "{}.roundings is {}; need >= 0", what, m.roundings);
  MESHTEST_CHECK(m.lambda > 0 && std::isfinite(m.lambda), "{}.lambda is {}; need finite and > 0",
                 what, m.lambda);
}

double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 0x1p-53;
    case DType::f32:
      return 0x1p-24;
    case DType::bf16:
      return 0x1p-8;
    case DType::f16:
      return 0x1p-11;
    default:
      fail("unit_roundoff: {} is not a floating dtype", dtype);
  }
}

double accumulation_roundoff(DType dtype) {
  return unit_roundoff(dtype == DType::f64 ? DType::f64 : DType::f32);
}

std::string ErrorModel::str() const {
  return fmt::format("{} n={} r={} {} lambda={}", dtype, terms, roundings,
                     reference_name(reference), lambda);
}

double error_bound(const ErrorModel& model, double scale, double expected) {
  check_model(model, "error_bound: ErrorModel");
  MESHTEST_CHECK(scale >= 0 && std::isfinite(scale), "error_bound: scale {}; need finite >= 0",
                 scale);
  return relative_bound(model) * scale + rounding_bound(model, expected);
}

Comparison compare(const Tensor& expected, const Tensor& got, const ErrorModel& model,
                   const Tensor& scale) {
  check_same_shape("compare(model) scale", expected, scale);
  const Eigen::ArrayXd s = to_f64(scale);
  return compare_model(expected, got, model, [&](Eigen::Index i) { return s(i); });
}

Comparison compare(const Tensor& expected, const Tensor& got, const ErrorModel& model,
                   double scale) {
  return compare_model(expected, got, model, [scale](Eigen::Index) { return scale; });
}

Comparison compare(const Tensor& expected, const Tensor& got, const ErrorModel& model) {
  const Eigen::ArrayXd e = to_f64(expected);
  double scale = 0;
  for (Eigen::Index i = 0; i < e.size(); ++i) {
    if (std::isfinite(e(i))) scale = std::max(scale, std::abs(e(i)));
  }
  return compare(expected, got, model, scale);
}

Tensor magnitude(const Tensor& t) {
  Tensor out = t.astype(DType::f64);
  for (double& v : out.span<double>()) v = std::abs(v);
  return out;
}

}  // namespace meshtest
