// linear (GPU): y = x Wᵀ + b on DeviceTensors through cuBLASLt, the CPU linear's contract.
#pragma once

#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"

namespace meshtest::gpu {

/// y = x Wᵀ (+ b), like the CPU linear (src/ops/linear.hpp), queued on blas.stream():
///   x: [..., in], weight: [out, in], bias: [out]  ->  [..., out]
/// One dtype for all, f32 or bf16; products accumulate in f32 (no TF32) and bf16 rounds the
/// output once, after the bias, as on the CPU. Every non-empty tensor must be on blas.device()
/// (an Error names the tensor and both devices). The op's perf record ("linear", attributes in,
/// out, bias) is timed on the stream (op_timer.hpp).
/// Asynchronous: x and the weights must be complete or queued on blas.stream(); y is complete
/// after blas.synchronize().
DeviceTensor linear(Blas& blas, const DeviceTensor& x, const DeviceTensor& weight,
                    const DeviceTensor& bias);
/// y = x Wᵀ without bias.   x: [..., in], weight: [out, in]  ->  [..., out]
DeviceTensor linear(Blas& blas, const DeviceTensor& x, const DeviceTensor& weight);

/// The checks of linear (shapes, dtypes, devices) without running it; bias may be null. Throws
/// the Error linear would. For callers that agree on their inputs before a collective.
void check_linear(const Blas& blas, const DeviceTensor& x, const DeviceTensor& weight,
                  const DeviceTensor* bias);

}  // namespace meshtest::gpu
