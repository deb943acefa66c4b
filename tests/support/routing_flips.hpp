// The routing rule of the GPU tests: a router GEMM summed in another order than the CPU's may
// tip a near-tie, so routes are compared only where the CPU logits' gap between a token's k-th
// and (k+1)-th largest exceeds the logits' error bound.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "src/core/tensor.hpp"
#include "src/ops/moe/types.hpp"

namespace meshtest::test_support {

/// The tokens whose experts differ between `a` and `b` although the CPU logits' gap between the
/// k-th and the (k+1)-th largest exceeds `bound` (twice a logit's error bound: both sides may
/// move): a route the rounding of the router's GEMM cannot explain. logits: [T, E] of a's tokens.
inline std::vector<std::int64_t> unexplained_flips(const Tensor& logits, const Routing& a,
                                                   const Routing& b, double bound) {
  std::vector<std::int64_t> out;
  const std::int64_t e = logits.shape()[1];
  for (std::int64_t t = 0; t < a.num_tokens; ++t) {
    if (std::equal(a.experts.begin() + t * a.k, a.experts.begin() + (t + 1) * a.k,
                   b.experts.begin() + t * b.k)) {
      continue;
    }
    std::vector<double> row(static_cast<std::size_t>(e));
    for (std::int64_t j = 0; j < e; ++j) row[j] = logits.item(t * e + j);
    std::sort(row.begin(), row.end(), std::greater<>());
    const double margin = a.k < e ? row[a.k - 1] - row[a.k] : 0.0;
    if (margin > bound) out.push_back(t);
  }
  return out;
}

/// The tokens whose experts differ between a and b (the same tokens and k).
inline std::vector<std::int64_t> flipped_tokens(const Routing& a, const Routing& b) {
  std::vector<std::int64_t> out;
  for (std::int64_t t = 0; t < a.num_tokens; ++t) {
    if (!std::equal(a.experts.begin() + t * a.k, a.experts.begin() + (t + 1) * a.k,
                    b.experts.begin() + t * b.k)) {
      out.push_back(t);
    }
  }
  return out;
}

}  // namespace meshtest::test_support
