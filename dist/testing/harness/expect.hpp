// One-call checks for tests, on the CPU and on GPU ranks: a result against its reference under
// the error model of docs/tolerances.md, and an expected meshtest::Error.
//
//   EXPECT_TRUE(within_model(y, reference_linear3, {x, w, b}, gemm_terms(k + 1)));
//   MESHTEST_EXPECT_ERROR(linear(x, bad_w), "disagree on K");
//
// Both are local (no collective): each rank asserts on its own result, and the harness agrees on
// one verdict per test (a failure names its rank).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "src/core/tensor.hpp"

namespace meshtest::dist::testing {

/// How a result was computed, for within_model: the terms added per element over the whole op
/// (a GEMM over K: K, one more per bias or partial sum), the stages that round to a narrow dtype
/// (bf16, f16: one per op of a chain; 0 for f32, f64), and the confidence lambda (7: a false
/// failure has probability at most 4.6e-11 per element).
struct Terms {
  std::int64_t terms = 1;
  std::int64_t roundings = 0;
  double lambda = 7.0;
};

/// A GEMM-like op whose elements each add k terms (add one for a bias, one per partial sum).
inline Terms gemm_terms(std::int64_t k) { return {.terms = k}; }
/// An elementwise op: each element is one operation on its inputs, rounded once.
inline Terms elementwise_terms() { return {.terms = 1}; }
/// A chain of ops: `terms` added per element over the chain, `roundings` stages rounding to
/// the result's dtype.
inline Terms chain_terms(std::int64_t terms, std::int64_t roundings) {
  return {.terms = terms, .roundings = roundings};
}

/// A reference op on host tensors (the inputs, in order).
using HostReference = std::function<Tensor(const std::vector<Tensor>& inputs)>;

/// `got` (this rank's result) against reference(inputs) run in f64, under the error model of
/// got's dtype with `terms`, each element's bound scaled by its sum of |terms| (the reference run
/// on the magnitudes of the inputs). On failure the message names the worst element, its
/// coordinates, got, expected, the bound there, the model and this rank (device) of the job.
/// Throws meshtest::Error when the shapes differ or got's dtype is not floating.
::testing::AssertionResult within_model(const Tensor& got, const HostReference& reference,
                                        const std::vector<Tensor>& inputs, const Terms& terms);

/// The same against an expected tensor and one magnitude for every element (max |expected| when
/// `scale` is negative): for a closed form, or a result whose terms are zero-mean or of one sign.
::testing::AssertionResult within_model(const Tensor& got, const Tensor& expected,
                                        const Terms& terms, double scale = -1);

/// The message of the meshtest::Error that f throws, without a leading "[rank r] " (a rank's
/// errors carry it, a single device's do not), or "" when f returns. Other exceptions propagate.
std::string error_message_of(const std::function<void()>& f);

/// Whether `message` (from error_message_of) is an error containing `fragment`, as an assertion.
::testing::AssertionResult error_with(const std::string& message, const std::string& fragment);

}  // namespace meshtest::dist::testing

/// Expects `statement` to throw meshtest::Error whose message contains `fragment` (on this rank;
/// write it on every rank that runs the statement).
#define MESHTEST_EXPECT_ERROR(statement, fragment)                                        \
  EXPECT_TRUE(::meshtest::dist::testing::error_with(                                      \
      ::meshtest::dist::testing::error_message_of([&] { static_cast<void>(statement); }), \
      fragment))                                                                          \
      << "from: " #statement
