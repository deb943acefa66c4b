// compare(): a named metric with a threshold, NaN/Inf checked first, and the worst element.
#include "src/check/compare.hpp"

#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <utility>

#include "src/check/ulp.hpp"

namespace meshtest {
namespace {

void append_note(Comparison& c, const std::string& note) {
  c.note += c.note.empty() ? note : "; " + note;
}

/// A Comparison with the shape, the NaN/Inf count (and its note) and, as the worst element, the
/// first got-NaN/Inf-where-expected-is-finite element or else argmax abs_error.
Comparison scan(const Tensor& expected, const Eigen::ArrayXd& e, const Eigen::ArrayXd& g) {
  Comparison c;
  c.shape = expected.shape();
  std::int64_t first_bad = -1;
  double worst = 0.0;
  for (Eigen::Index i = 0; i < e.size(); ++i) {
    if (!std::isfinite(g(i)) && std::isfinite(e(i)) && c.nan_or_inf_count++ == 0) {
      first_bad = i;
    }
    const double d = abs_error(e(i), g(i));
    if (d > worst) {
      worst = d;
      c.worst_index = i;
    }
  }
  if (first_bad >= 0) {
    c.worst_index = first_bad;
    append_note(c, fmt::format("got has {} NaN/Inf where expected is finite (first at index {})",
                               c.nan_or_inf_count, first_bad));
  }
  return c;
}

/// Fills value, passed and (unless NaN/Inf already chose it) the worst element for exact.
void compare_exact(Comparison& c, const Tensor& expected, const Tensor& got) {
  c.threshold = 0;
  std::int64_t differing = 0, first = -1;
  if (expected.dtype() != got.dtype()) {
    differing = expected.numel();
    first = differing > 0 ? 0 : -1;
    append_note(c,
                fmt::format("dtypes differ: expected {}, got {}", expected.dtype(), got.dtype()));
  } else {
    const std::size_t w = dtype_size(expected.dtype());
    for (std::int64_t i = 0; i < expected.numel(); ++i) {
      const std::size_t at = static_cast<std::size_t>(i) * w;
      if (std::memcmp(expected.bytes() + at, got.bytes() + at, w) != 0 && differing++ == 0) {
        first = i;
      }
    }
  }
  c.value = static_cast<double>(differing);
  c.passed = expected.bitwise_equal(got);
  if (c.nan_or_inf_count == 0) {
    c.worst_index = first;
  }
}

Comparison finish(Comparison c, const Eigen::ArrayXd& e, const Eigen::ArrayXd& g) {
  c.passed = c.passed && c.nan_or_inf_count == 0;
  if (c.worst_index >= 0) {
    c.worst_coord = unravel_index(c.shape, c.worst_index);
    c.expected_at_worst = e(c.worst_index);
    c.got_at_worst = g(c.worst_index);
  }
  return c;
}

}  // namespace

std::vector<std::int64_t> unravel_index(const Shape& shape, std::int64_t flat) {
  std::vector<std::int64_t> coord(static_cast<std::size_t>(shape.rank()));
  for (int d = shape.rank() - 1; d >= 0; --d) {
    coord[static_cast<std::size_t>(d)] = flat % shape[d];
    flat /= shape[d];
  }
  return coord;
}

std::string_view metric_name(Metric m) {
  switch (m) {
    case Metric::pcc:
      return "pcc";
    case Metric::allclose:
      return "allclose";
    case Metric::nmse:
      return "nmse";
    case Metric::max_abs:
      return "max_abs";
    case Metric::max_rel:
      return "max_rel";
    case Metric::ulp:
      return "ulp";
    case Metric::exact:
      return "exact";
    case Metric::model:
      return "model";
  }
  return "?";
}

Comparison compare(const Tensor& expected, const Tensor& got, Metric metric, double threshold) {
  check_same_shape(fmt::format("compare({})", metric_name(metric)), expected, got);
  MESHTEST_CHECK(metric != Metric::allclose,
                 "compare: Metric::allclose takes tolerances, not a threshold; call "
                 "compare(expected, got, Tolerance{{.rtol = ..., .atol = ...}})");
  MESHTEST_CHECK(metric != Metric::model,
                 "compare: Metric::model takes an ErrorModel, not a threshold; call "
                 "compare(expected, got, ErrorModel{{...}}) (src/check/tolerance.hpp)");
  const Eigen::ArrayXd e = to_f64(expected), g = to_f64(got);
  Comparison c = scan(expected, e, g);
  c.metric = metric_name(metric);
  c.kind = metric;
  c.threshold = threshold;
  switch (metric) {
    case Metric::pcc:
      c.value = pcc(e, g);
      break;
    case Metric::nmse:
      c.value = nmse(e, g);
      break;
    case Metric::max_abs:
      c.value = max_abs_error(e, g);
      break;
    case Metric::max_rel:
      c.value = max_rel_error(e, g);
      break;
    case Metric::ulp:
      c.value = static_cast<double>(ulp_distance(expected, got));
      break;
    case Metric::exact:
    case Metric::allclose:
    case Metric::model:
      break;
  }
  if (metric == Metric::exact) {
    compare_exact(c, expected, got);
  } else {
    // NaN compares false either way, so a NaN value fails.
    c.passed = metric == Metric::pcc ? c.value >= threshold : c.value <= threshold;
  }
  return finish(std::move(c), e, g);
}

Comparison compare(const Tensor& expected, const Tensor& got, const Tolerance& tol) {
  check_same_shape("compare(allclose)", expected, got);
  const Eigen::ArrayXd e = to_f64(expected), g = to_f64(got);
  Comparison c = scan(expected, e, g);
  c.metric = fmt::format("allclose(rtol={}, atol={}{})", tol.rtol, tol.atol,
                         tol.equal_nan ? ", equal_nan" : "");
  c.kind = Metric::allclose;
  c.value = static_cast<double>(count_not_close(e, g, tol));
  c.threshold = 0;
  c.passed = c.value == 0;
  return finish(std::move(c), e, g);
}

int owner_of(const Shape& global, std::int64_t flat_index, int dim, int devices) {
  MESHTEST_CHECK(devices >= 1, "owner_of: {} devices; need at least 1", devices);
  const int d = global.normalize_dim(dim);
  MESHTEST_CHECK(flat_index >= 0 && flat_index < global.numel(),
                 "owner_of: index {} out of range [0, {}) for shape {}", flat_index, global.numel(),
                 global);
  const std::int64_t i = (flat_index / global.inner(d)) % global[d];
  for (int p = 0; p < devices; ++p) {
    const Range r = split_range(global[d], devices, p);
    if (i < r.start + r.size) {
      return p;
    }
  }
  fail("owner_of: index {} along dim {} of shape {} is in no part", i, d, global);
}

void attach_owner(Comparison& c, int dim, int devices) {
  if (c.worst_index >= 0) {
    c.owner_device = owner_of(c.shape, c.worst_index, dim, devices);
  }
}

std::string Comparison::str() const {
  std::string s = fmt::format("{} {} = {} (threshold {} {}) on {}", passed ? "pass" : "FAIL",
                              metric, value, kind == Metric::pcc ? ">=" : "<=", threshold, shape);
  if (worst_index < 0) {
    s += ": no element differs";
  } else {
    s += fmt::format(": worst element index {} at [{}]", worst_index, fmt::join(worst_coord, ", "));
    if (owner_device >= 0) {
      s += fmt::format(" on device {}", owner_device);
    }
    s += fmt::format(": expected {}, got {}", expected_at_worst, got_at_worst);
  }
  if (!note.empty()) {
    s += "; " + note;
  }
  return s;
}

std::ostream& operator<<(std::ostream& os, const Comparison& c) { return os << c.str(); }

}  // namespace meshtest
