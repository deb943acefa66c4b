// rms_norm (GPU): gpt-oss's RMSNorm of a DeviceTensor's rows.
#pragma once

#include <cuda_runtime_api.h>

#include "src/gpu/device_tensor.hpp"
#include "src/ops/rms_norm.hpp"

namespace meshtest::gpu {

/// The CPU rms_norm (src/ops/rms_norm.hpp) on the GPU, queued on `stream` (of x's device):
///   y = x / sqrt(mean(x², last dim) + eps) · scale, computed in f32 and rounded once to x's
///   dtype.   x: [..., hidden] (f32 or bf16), scale: [hidden] (f32 or bf16)  ->  x's shape
/// The sum of squares is taken in another order than the host's, so the two differ within the
/// error model of an f32 sum over hidden (docs/tolerances.md). Errors as the CPU op's (scale's
/// shape, eps negative or not finite), and for another dtype or a tensor on another device. The
/// perf record ("rms_norm", attribute eps) is timed on the stream. Asynchronous, as swiglu.
DeviceTensor rms_norm(const DeviceTensor& x, const DeviceTensor& scale, cudaStream_t stream,
                      double eps = kRmsNormEps);

}  // namespace meshtest::gpu
