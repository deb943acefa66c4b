// grouped_gemm: segmented GEMM, one weight matrix per contiguous segment of rows (MoE experts).
#pragma once

#include <cstdint>
#include <span>

#include "src/core/tensor.hpp"

namespace meshtest {

/// out[offsets[e] : offsets[e+1]] = x[offsets[e] : offsets[e+1]] · W[e]ᵀ (+ bias[e]) for every
/// group e; empty segments are legal and cost nothing.
///   x: [rows, in], offsets: [G + 1] from 0 to rows, non-decreasing, w: [G, out, in],
///   bias: [G, out] or an empty Tensor  ->  [rows, out], x's dtype
/// The weight layout is the checkpoint's (mlp1_weight [E, 2I, hidden], mlp2_weight
/// [E, hidden, I]). f32, f64 or bf16 (bf16 computes in f32 and rounds the product, then the
/// bias sum, as moe_experts does). Each segment is one Eigen GEMM on views of x and out (no
/// copies). Throws Error for offsets that do not fit rows and G, or shapes/dtypes that disagree.
Tensor grouped_gemm(const Tensor& x, std::span<const std::int64_t> offsets, const Tensor& w,
                    const Tensor& bias = {});

/// The backward of grouped_gemm (no bias term needed for grad_x and grad_w):
///   grad_x[seg] = grad_out[seg] · W[e];  grad_w[e] = grad_out[seg]ᵀ · x[seg];
///   grad_bias[e] = Σ_rows grad_out[seg] (zero for an empty segment). f32 or f64.
struct GroupedGemmGrads {
  Tensor x;     ///< [rows, in]
  Tensor w;     ///< [G, out, in]
  Tensor bias;  ///< [G, out]
};
GroupedGemmGrads grouped_gemm_backward(const Tensor& x, std::span<const std::int64_t> offsets,
                                       const Tensor& w, const Tensor& grad_out);

}  // namespace meshtest
