// rms_norm: x * rsqrt(mean(x²) + eps) * scale over the last dim.
#pragma once

#include "src/core/tensor.hpp"

namespace meshtest {

/// Default epsilon of gpt-oss RMSNorm.
inline constexpr double kRmsNormEps = 1e-5;

/// RMSNorm of every row of the last dim, as gpt-oss: t = x * rsqrt(mean(x²) + eps), then
/// t * scale, computed in f32 (in f64 for f64 x) and rounded to x's dtype.
///   x: [..., hidden], scale: [hidden]  ->  [..., hidden]
/// `scale` may have any floating dtype (the reference keeps it in f32 in a bf16 model); it is
/// converted to the compute type. Throws Error for a shape mismatch or non-floating dtypes.
Tensor rms_norm(const Tensor& x, const Tensor& scale, double eps = kRmsNormEps);

}  // namespace meshtest
