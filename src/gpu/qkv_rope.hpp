// qkv_rope (GPU): the attention block's qkv Linear, q/k/v split and RoPE on DeviceTensors.
#pragma once

#include <span>

#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/ops/qkv_rope.hpp"

namespace meshtest::gpu {

/// q, k and v on the GPU (Qkv's shapes: q [T, kv_heads, heads / kv_heads, d], k and v
/// [T, kv_heads, d]).
struct DeviceQkv {
  DeviceTensor q, k, v;
};

/// The CPU qkv_rope (src/ops/qkv_rope.hpp) on the GPU: linear(x, weight, bias) on cuBLASLt (f32
/// accumulation, the bias in the epilogue, bf16 rounded once after it), the columns split into
/// q, k and v, and gpu::rope of q and k at positions o.position_offset ..; complete when it
/// returns. The Linear sums in cuBLASLt's order, so q, k and v are the CPU's within the error
/// model of a sum over hidden (+ the bias); the split and the rotation add nothing: rope of the
/// GPU's Linear output on the CPU gives the same bits. o.row_block and o.column_block (the CPU
/// op's tiling) are not used. x: [T, hidden], f32 or bf16. Errors as the CPU op's. Capturable in
/// a CUDA graph (gpu::Graph) once its positions are in the GPU's rope table (gpu::rope: an
/// eager call at them first).
DeviceQkv qkv_rope(Blas& blas, const DeviceTensor& x, const DeviceTensor& weight,
                   const DeviceTensor& bias, const QkvRopeOptions& o);

/// qkv_rope with token i at positions[i] (host memory, one per token, each >= 0) instead of
/// o.position_offset + i (which must be 0): the rows of several sequences at their own positions
/// in one Linear and one rotation (gpu::rope_at), as the model's batch decode step runs them
/// (one token of each of 64 sequences: one call instead of 64). Token i's q and k are the CPU
/// rope's bits at its position on the GPU's Linear output; the Linear is within the model of
/// qkv_rope's. Complete when it returns; not capturable in a CUDA graph. Errors as qkv_rope's
/// and rope_at's.
DeviceQkv qkv_rope_at(Blas& blas, const DeviceTensor& x, const DeviceTensor& weight,
                      const DeviceTensor& bias, const QkvRopeOptions& o,
                      std::span<const std::int64_t> positions);

}  // namespace meshtest::gpu
