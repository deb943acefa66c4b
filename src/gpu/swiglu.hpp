// swiglu (GPU): the gpt-oss clamped SwiGLU on interleaved gate/linear columns of a DeviceTensor.
#pragma once

#include <cuda_runtime_api.h>

#include "src/gpu/device_tensor.hpp"
#include "src/ops/activations.hpp"

namespace meshtest::gpu {

/// The CPU swiglu (src/ops/activations.hpp) on the GPU, queued on `stream` (of x's device):
///   x_glu = x[..., 0::2], x_lin = x[..., 1::2]; glu = min(x_glu, limit),
///   lin = clamp(x_lin, -limit, limit), out = glu · σ(alpha · glu) · (lin + 1).
///   x: [..., 2I]  ->  [..., I]
/// f32 or bf16; bf16 computes each step in f32 and rounds it to bf16, as the CPU op, so the two
/// differ only where the GPU's expf (2 ulp) and the host's exp round differently. Errors as the
/// CPU op's (an odd last dim, alpha or limit not finite, limit <= 0), and for another dtype.
/// The perf record ("swiglu", attributes alpha, limit) is timed on the stream. Asynchronous: x
/// must be complete or queued on `stream`; the output is complete once the stream is.
DeviceTensor swiglu(const DeviceTensor& x, cudaStream_t stream, double alpha = kSwigluAlpha,
                    double limit = kSwigluLimit);

}  // namespace meshtest::gpu
