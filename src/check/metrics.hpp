// Value metrics comparing an expected tensor with a computed one: pcc, allclose, nmse, max errors.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <limits>
#include <string_view>

#include "src/core/tensor.hpp"

namespace meshtest {

// Every metric here takes (expected, got): `expected` is the single-device reference, `got` the
// result under test. Tensors of any dtype are compared as double; their dtypes may differ, but
// their shapes must match exactly (else meshtest::Error naming both). The Eigen::ArrayXd
// overloads take flat values already in double and only need equal sizes.

/// numpy.isclose tolerances: |got - expected| <= atol + rtol * |expected|.
struct Tolerance {
  double rtol = 1e-5;
  double atol = 1e-8;
  bool equal_nan = false;  ///< NaN is close to NaN only when true.
};

/// Denominator floor of max_rel_error: the smallest normal double, so that an exact 0 over 0
/// gives 0 while any representable value of f32/bf16/f64 keeps its true relative error.
inline constexpr double kRelErrorFloor = std::numeric_limits<double>::min();

/// Throws meshtest::Error unless the shapes are equal; `what` names the caller.
void check_same_shape(std::string_view what, const Tensor& expected, const Tensor& got);

/// All elements of `t` converted to double, flat in row-major order.
Eigen::ArrayXd to_f64(const Tensor& t);

/// |got - expected| for one element, with 0 for equal values (same Inf, +0/-0) and for NaN in
/// both; +Inf when exactly one is NaN or an Inf meets a different value.
double abs_error(double expected, double got);

/// numpy.isclose for one element: NaN is never close (unless tol.equal_nan and both are NaN);
/// +-Inf is close only to the same Inf.
bool is_close(double expected, double got, const Tolerance& tol);

/// Pearson correlation with the comp_pcc rules of mesh-device test suites, in this order:
/// both all-NaN -> 1; exactly one all-NaN -> 0; then NaN/Inf are replaced by 0 in both;
/// exactly one all-zero -> 0; element-wise equal -> 1; a constant (zero-variance) input that is
/// not equal to the other -> 0 (comp_pcc's masked corrcoef would report 1 here; we report the
/// mismatch instead); else Pearson r in f64, clamped to [-1, 1]. Two empty tensors give 1.
double pcc(const Tensor& expected, const Tensor& got);
double pcc(const Eigen::ArrayXd& expected, const Eigen::ArrayXd& got);

/// numpy.allclose: every element is_close. Empty tensors are close.
bool allclose(const Tensor& expected, const Tensor& got, double rtol, double atol,
              bool equal_nan = false);
/// allclose with a Tolerance (numpy's defaults rtol 1e-5, atol 1e-8).
bool allclose(const Tensor& expected, const Tensor& got, const Tolerance& tol = {});
/// Number of elements that are not is_close.
std::int64_t count_not_close(const Eigen::ArrayXd& expected, const Eigen::ArrayXd& got,
                             const Tolerance& tol);

/// Normalised MSE: mse(expected, got) / mse(expected, 0) = sum (got-expected)^2 / sum expected^2.
/// 0/0 = 0 (both zero, or empty) and x/0 = +Inf for x > 0. NaN or Inf in the inputs give NaN or
/// Inf (compare() reports non-finite values first).
double nmse(const Tensor& expected, const Tensor& got);
double nmse(const Eigen::ArrayXd& expected, const Eigen::ArrayXd& got);

/// Largest abs_error over the elements; 0 when empty.
double max_abs_error(const Tensor& expected, const Tensor& got);
double max_abs_error(const Eigen::ArrayXd& expected, const Eigen::ArrayXd& got);

/// Largest abs_error / max(|expected|, kRelErrorFloor); a zero error is 0 and an infinite one
/// +Inf. 0 when empty.
double max_rel_error(const Tensor& expected, const Tensor& got);
double max_rel_error(const Eigen::ArrayXd& expected, const Eigen::ArrayXd& got);

}  // namespace meshtest
