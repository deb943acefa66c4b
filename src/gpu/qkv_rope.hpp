// qkv_rope (GPU): the attention block's qkv Linear, q/k/v split and RoPE on DeviceTensors.
#pragma once

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

}  // namespace meshtest::gpu
