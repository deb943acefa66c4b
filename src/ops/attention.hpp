// attention: the gpt-oss attention block (norm, qkv, RoPE, sdpa with sinks, out, residual).
// Its types are in attention_types.hpp (included here).
#pragma once

#include <cstdint>

#include "src/core/tensor.hpp"
#include "src/ops/attention_types.hpp"
#include "src/ops/rms_norm.hpp"
#include "src/ops/rope.hpp"

namespace meshtest {

/// Throws an Error naming the first weight whose shape or dtype does not fit `p`, `hidden`
/// and `dtype`, or parameters that do not fit together (heads not divisible by kv heads).
void check_attention(const AttentionWeights& w, const AttentionParams& p, std::int64_t hidden,
                     DType dtype);

/// Splits qkv columns into q (first heads*d), k (next kv_heads*d) and v (last kv_heads*d).
///   qkv: [T, (heads + 2 kv_heads) * d]  ->  Qkv
Qkv split_qkv(const Tensor& qkv, std::int64_t num_heads, std::int64_t num_kv_heads,
              std::int64_t head_dim);

/// The block's q, k and v after RoPE, token i at position `offset` + i:
///   p.fused off: split_qkv(linear(t, qkv.weight, qkv.bias)), then rope(q, k, p.rope, offset);
///   p.fused on:  qkv_rope(t, qkv.weight, qkv.bias, {heads, kv_heads, p.rope, offset}).
///   t: [T, hidden]  ->  Qkv with p.num_heads / p.num_kv_heads heads (a TP device passes its
///   local params). Throws as linear, split_qkv, rope or qkv_rope do.
Qkv attention_qkv(const Tensor& t, const AttentionWeights& w, const AttentionParams& p,
                  std::int64_t offset = 0);

/// The block's attention over q, k, v with its sinks, `p.sliding_window` and q at `q_offset`:
/// sdpa (p.fused off) or sdpa_sinks (on).   ->  [Tq, heads * d]. Throws as sdpa does.
Tensor attention_sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& sinks,
                      const AttentionParams& p, std::int64_t q_offset = 0);

/// The attention block at positions 0 .. T-1:
///   t = rms_norm(x); (q, k, v) = split_qkv(linear(t, qkv)); (q, k) = rope(q, k);
///   out = x + linear(sdpa(q, k, v, sinks, {sliding_window}), out).
/// With p.fused, qkv_rope and sdpa_sinks replace the linear + split_qkv + rope and the sdpa
/// (attention_qkv, attention_sdpa).
///   x: [T, hidden]  ->  [T, hidden], x's dtype (f32, f64 or bf16; weights of the same dtype).
Tensor attention_block(const Tensor& x, const AttentionWeights& w, const AttentionParams& p);

}  // namespace meshtest
