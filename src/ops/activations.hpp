// activations: the gpt-oss clamped SwiGLU on interleaved gate/linear columns.
#pragma once

#include "src/core/tensor.hpp"
#include "src/ops/compute.hpp"

namespace meshtest {

/// Defaults of gpt-oss swiglu.
inline constexpr double kSwigluAlpha = 1.702;
inline constexpr double kSwigluLimit = 7.0;
/// Flops counted per swiglu output (min, clamp, scale, exp, add, divide, 3 multiplies, add).
inline constexpr double kSwigluFlops = 10.0;

/// gpt-oss SwiGLU on interleaved columns: x_glu = x[..., 0::2], x_lin = x[..., 1::2];
///   glu = min(x_glu, limit), lin = clamp(x_lin, -limit, limit),
///   out = glu · σ(alpha · glu) · (lin + 1).
///   x: [..., 2I]  ->  [..., I]
/// f32, f64 or bf16; bf16 computes each step in f32 and rounds it to bf16, as the reference's
/// bf16 tensor ops do.
Tensor swiglu(const Tensor& x, double alpha = kSwigluAlpha, double limit = kSwigluLimit);

namespace detail {
/// swiglu of the rows of a compute-type matrix [n, 2I] -> [n, I] with S's rounding (S = float,
/// double or bf16); shared by swiglu and the MoE experts.
template <class S>
RowMatrix<compute_t<S>> swiglu_rows(const Eigen::Ref<const RowMatrix<compute_t<S>>>& x,
                                    double alpha, double limit);
}  // namespace detail

}  // namespace meshtest
