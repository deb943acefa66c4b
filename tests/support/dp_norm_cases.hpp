// The per-sample norm cases of the DP kernels' tests, CPU (tests/test_dp_kernels.cpp) and GPU
// (tests/gpu/test_gpu_dp.cpp): a batch's shape and dtype, its inputs, the norms by naive loops
// in f64 and their error model.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "tests/support/dp_reference.hpp"

namespace meshtest::test_support {

/// B samples of T rows (seq 0: a 2-D [B, d] input) into a Linear of d_in -> d_out.
struct NormCase {
  std::int64_t batch, seq, din, dout;
  DType dtype = DType::f64;
};

inline std::string name(const NormCase& c) {
  return fmt::format("B={} T={} din={} dout={} {}", c.batch, c.seq, c.din, c.dout, c.dtype);
}

inline Shape shape_of(const NormCase& c, std::int64_t d) {
  return c.seq == 0 ? Shape{c.batch, d} : Shape{c.batch, c.seq, d};
}

/// Seeded normal inputs of c's shape with d features.
inline Tensor make(const NormCase& c, std::int64_t d, std::uint64_t seed) {
  return random_normal(shape_of(c, d), c.dtype, {.seed = seed});
}

/// ‖G_iᵀA_i‖² by naive loops in f64.
inline Tensor naive_norm_sq(const Tensor& a, const Tensor& g) {
  std::vector<double> out;
  for (std::int64_t i = 0; i < a.shape()[0]; ++i) {
    out.push_back(sum_sq(naive_sample_weight_grad(a, g, i)));
  }
  return as_tensor(out);
}

/// T (1 for a 2-D input).
inline std::int64_t seq(const NormCase& c) { return c.seq == 0 ? 1 : c.seq; }

/// The error model of a per-sample ‖G_iᵀA_i‖² against another method or the naive loops. Terms
/// per element: the ghost method sums the Grams over d_in and d_out, then their product over
/// T²; the direct method and the loops sum W_i over T, then its d_out·d_in squares. The larger
/// chain counts for both sides. The naive loops run in f64: an exact reference for f32 inputs,
/// the same dtype in another order for f64.
inline ErrorModel norm_model(const NormCase& c) {
  const std::int64_t t = seq(c);
  return {.dtype = c.dtype,
          .terms = std::max(c.din + c.dout + t * t, t + c.din * c.dout),
          .reference = c.dtype == DType::f64 ? Reference::other_order : Reference::exact};
}

}  // namespace meshtest::test_support
