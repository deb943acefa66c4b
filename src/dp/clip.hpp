// Clip coefficients of DP-SGD: c_i = min(1, C / (‖g_i‖ + 1e-6)).
#pragma once

#include "src/core/tensor.hpp"

namespace meshtest::dp {

/// The stabiliser added to each norm before dividing.
inline constexpr double kClipEps = 1e-6;

/// c_i = min(1, C / (norm_i + 1e-6)) for every sample.   norms: [B] (f32/f64) -> [B]
/// Throws Error for C <= 0 (or not finite) and for a norms tensor that is not 1-D.
Tensor clip_coefficients(const Tensor& norms, double clip);

/// Throws Error unless clip is a finite C > 0; `who` names the caller.
void check_clip(double clip, const char* who);

}  // namespace meshtest::dp
