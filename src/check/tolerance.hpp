// The tolerance model: how far a result computed in another order may lie from its reference.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "src/check/compare.hpp"
#include "src/core/tensor.hpp"

namespace meshtest {

// A sharded GEMM, a blocked kernel or the same code on another processor adds the same terms in
// another order, so its result differs from the reference's by rounding errors whose size
// depends on the machine. This model bounds that difference from what does not: the dtypes'
// unit roundoffs, how many terms were added to make an element, how many times the chain
// rounded to a narrow dtype, and the magnitude of the terms. docs/tolerances.md derives it.
//
// For one element, with u_a the roundoff of the sums (f64 for f64, f32 otherwise: bf16 and f16
// ops accumulate in f32) and u_o the roundoff of the result's dtype:
//
//   |got - expected| <= lambda * S * sqrt(s * (n * u_a^2 + r * u_o^2)) + s * u_o * |expected|
//
//   n  terms added to make the element, summed over the chain of reductions behind it;
//   r  stages that round their whole output to the result's dtype before the next stage reads
//      it (bf16 and f16 chains: one per op; 0 for f32 and f64, whose roundings n counts);
//   S  the magnitude of the terms: per element, sum |terms| (magnitude(): the same ops run in
//      f64 on |inputs|), or for a whole tensor of zero-mean random or same-signed terms,
//      max |expected| (the default);
//   s  2 when the reference rounds the same way in another order, 1 for an exact reference
//      (f64 or a closed form);
//   lambda  how unlikely a false failure is: under the model (rounding errors independent and
//      zero-mean) an element exceeds its bound with probability at most 2 exp(-lambda^2 / 2)
//      (Azuma-Hoeffding); 7 gives 4.6e-11.
//
// Bit-exact contracts (CCLs, a sharding that keeps the order) use Metric::exact, not this.

/// Unit roundoff of a floating dtype: f64 2^-53, f32 2^-24, bf16 2^-8, f16 2^-11. Throws
/// meshtest::Error for an integer or byte dtype.
double unit_roundoff(DType dtype);

/// Unit roundoff of the sums behind a result of `dtype`: f64's for f64, f32's otherwise (bf16
/// and f16 ops accumulate in f32 and round once).
double accumulation_roundoff(DType dtype);

/// What a result is compared with.
enum class Reference {
  other_order,  ///< the same computation in the same dtypes, added in another order
  exact,        ///< an f64 computation or a closed form: its own error is negligible
};

/// How a result was computed: the inputs of the bound above.
struct ErrorModel {
  DType dtype = DType::f32;    ///< the result's dtype (and the chain's op outputs)
  std::int64_t terms = 1;      ///< n: terms added per element over the whole chain (>= 0)
  std::int64_t roundings = 0;  ///< r: stages rounding their output to dtype (bf16, f16: per op)
  Reference reference = Reference::other_order;
  double lambda = 7.0;  ///< confidence (> 0)

  /// "f32 n=8192 r=0 other_order lambda=7", for messages.
  std::string str() const;
};

/// Throws meshtest::Error naming `what` and the field when the model is unusable: a dtype that
/// is not floating, terms < 0, roundings < 0, lambda not finite and > 0.
void check_model(const ErrorModel& model, std::string_view what);

/// The bound on |got - expected| for one element whose terms have magnitude `scale` (sum of
/// |terms|, or the tensor's scale) and whose expected value is `expected`. Throws
/// meshtest::Error for a non-floating dtype, terms < 0, roundings < 0, lambda <= 0 or a
/// negative or non-finite scale.
double error_bound(const ErrorModel& model, double scale, double expected);

/// Compares under the model with a magnitude per element (`scale`, the shape of `expected`;
/// e.g. from magnitude()). Metric::model: value = max over elements of |got - expected| / bound,
/// threshold 1; the worst element is the one with the largest ratio. NaN/Inf in got fails as
/// in compare(). Throws meshtest::Error when the shapes differ.
Comparison compare(const Tensor& expected, const Tensor& got, const ErrorModel& model,
                   const Tensor& scale);
/// Compares under the model with one magnitude `scale` for every element.
Comparison compare(const Tensor& expected, const Tensor& got, const ErrorModel& model,
                   double scale);
/// Compares under the model with the tensor's scale: max |expected| (see the header comment for
/// when that is the magnitude of the terms).
Comparison compare(const Tensor& expected, const Tensor& got, const ErrorModel& model);

/// |t| in f64: run an op chain on magnitude()s of its inputs, in f64, to get each output's sum
/// of |terms| (exact for linear ops: products and sums of magnitudes are magnitudes).
Tensor magnitude(const Tensor& t);

}  // namespace meshtest
