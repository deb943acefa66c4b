// qkv_rope: the qkv Linear, the q/k/v split and RoPE of the gpt-oss attention block in one pass.
#pragma once

#include <cstdint>

#include "src/core/tensor.hpp"
#include "src/ops/attention_types.hpp"
#include "src/ops/rope.hpp"

namespace meshtest {

/// Head counts, positions and tile sizes of qkv_rope.
struct QkvRopeOptions {
  std::int64_t num_heads = 0;        ///< query heads
  std::int64_t num_kv_heads = 0;     ///< key/value heads; divides num_heads
  RopeParams rope;                   ///< YaRN RoPE; rope.head_dim is the head dim d
  std::int64_t position_offset = 0;  ///< position of token 0 (decode: the cache length)
  std::int64_t row_block = 2048;     ///< tokens per GEMM panel
  std::int64_t column_block = 512;   ///< qkv columns per weight block, rounded down to whole
                                     ///< heads (at least one)
};

/// The fused form of the attention block's
///   (q, k, v) = split_qkv(linear(x, weight, bias)); (q, k) = rope(q, k, rope, position_offset)
///   x: [T, hidden], weight: [(heads + 2 kv_heads) * d, hidden], bias: [(heads + 2 kv_heads) * d]
///   ->  q: [T, kv_heads, heads / kv_heads, d], k: [T, kv_heads, d], v: [T, kv_heads, d]
/// with token i at position position_offset + i. The weight is taken a block of whole heads at
/// a time (column_block columns); for each block, panels of row_block tokens are multiplied into
/// a [row_block, column_block] scratch, biased, and every head of the panel is rotated (q, k) or
/// copied (v) straight into its output: the [T, qkv] tensor of the reference is never formed.
/// The cos/sin table of the T positions ([T, d/2] each, rope_table) is computed once per call.
/// The defaults (whole prefills up to 2048 tokens per panel, 8 heads of 64 per block: a 4 MiB
/// f32 scratch at most) keep the GEMM as fast as the reference's single one: every panel makes
/// Eigen pack its weight block again, so small panels repack the weights T / row_block times.
///
/// Numerics follow the reference sequence: f32 and f64 compute in their own type, bf16 in f32
/// with the reference's roundings (the Linear output rounded once after the bias, every RoPE
/// product and sum rounded, bf16 cos/sin tables). Results equal the reference's up to the
/// summation order of the GEMM, which depends on the panel (bit for bit where the sums are
/// exact). T = 0 is allowed and gives empty q, k and v.
///
/// Traceable: while a perf::Trace captures, the call records a compute step that reruns the
/// GEMM, bias and RoPE from the buffers of x, weight and bias into those of q, k and v, with
/// the cos/sin table computed at capture (the positions are fixed) and no validation or
/// allocation (bf16 conversions reuse the step's scratch).
///
/// Throws Error (naming what is wrong) for x not of rank 2, num_heads or num_kv_heads < 1,
/// num_heads not a multiple of num_kv_heads, rope.head_dim not positive and even, a weight or
/// bias whose shape or dtype does not fit, a dtype other than f32, f64 or bf16, a negative
/// position_offset, row_block or column_block < 1; bad YaRN parameters throw from rope.
Qkv qkv_rope(const Tensor& x, const Tensor& weight, const Tensor& bias,
             const QkvRopeOptions& options);

}  // namespace meshtest
