// compare(): a named metric with a threshold, NaN/Inf checked first, and the worst element.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "src/check/metrics.hpp"
#include "src/core/tensor.hpp"

namespace meshtest {

/// The metric of a comparison and how its value meets the threshold:
///   pcc       value = pcc();            passes when value >= threshold.
///   allclose  value = elements not close under a Tolerance; passes when value == 0
///             (only through the compare(expected, got, Tolerance) overload).
///   nmse      value = nmse();           passes when value <= threshold.
///   max_abs   value = max_abs_error();  passes when value <= threshold.
///   max_rel   value = max_rel_error();  passes when value <= threshold.
///   ulp       value = ulp_distance();   passes when value <= threshold.
///   exact     value = elements whose bytes differ; passes only when dtype, shape and bytes are
///             equal (the threshold is ignored and reported as 0).
///   model     value = max over elements of |got - expected| / the error model's bound; passes
///             when value <= 1 (only through the ErrorModel overloads of src/check/tolerance.hpp).
enum class Metric { pcc, allclose, nmse, max_abs, max_rel, ulp, exact, model };

/// "pcc", "allclose", "nmse", "max_abs", "max_rel", "ulp", "exact", "model".
std::string_view metric_name(Metric m);

/// The outcome of compare(). The worst element is argmax abs_error(expected, got) (first on
/// ties; for exact, the first element whose bytes differ), or the first element where got is
/// NaN/Inf while expected is finite; worst_index is -1 when no element differs.
struct Comparison {
  std::string metric;  ///< metric name, with its tolerances for allclose
  Metric kind = Metric::pcc;
  double value = 0;
  double threshold = 0;
  bool passed = false;
  Shape shape;  ///< shape of both tensors
  std::int64_t worst_index = -1;
  std::vector<std::int64_t> worst_coord;
  double expected_at_worst = 0;
  double got_at_worst = 0;
  std::int64_t nan_or_inf_count = 0;  ///< elements where got is NaN/Inf and expected is finite
  int owner_device = -1;              ///< device owning the worst element, -1 when unknown
  std::string note;                   ///< why it failed besides the value, if anything

  /// One line: verdict, metric, value, threshold, worst element, owning device and note.
  std::string str() const;
};

/// Compares `got` with `expected` by `metric` (see Metric for the pass rule). A `got` with
/// NaN/Inf where `expected` is finite always fails. Dtypes may differ (except for exact, which
/// then fails); differing shapes throw meshtest::Error. Metric::allclose throws here: use the
/// Tolerance overload. Empty tensors pass.
Comparison compare(const Tensor& expected, const Tensor& got, Metric metric, double threshold);
/// Compares by allclose under `tol`: value = number of elements not close, threshold 0.
Comparison compare(const Tensor& expected, const Tensor& got, const Tolerance& tol);

/// The coordinates of row-major element `flat` of `shape`.
std::vector<std::int64_t> unravel_index(const Shape& shape, std::int64_t flat);

/// The device that owns element `flat_index` of a tensor of shape `global` sharded along `dim`
/// over `devices` devices by the array_split rule (split_range). Negative `dim` counts from the
/// end. Throws meshtest::Error for an index out of range, a bad dim or devices < 1.
int owner_of(const Shape& global, std::int64_t flat_index, int dim, int devices);

/// Sets c.owner_device to owner_of(c.shape, c.worst_index, dim, devices) when there is a worst
/// element.
void attach_owner(Comparison& c, int dim, int devices);

std::ostream& operator<<(std::ostream& os, const Comparison& c);

}  // namespace meshtest

template <>
struct fmt::formatter<meshtest::Comparison> : fmt::formatter<std::string> {
  auto format(const meshtest::Comparison& c, format_context& ctx) const {
    return fmt::formatter<std::string>::format(c.str(), ctx);
  }
};
