// attention_types: the gpt-oss attention block's sizes, options and weights, and the q/k/v
// triple that the block and the fused qkv_rope op both return.
#pragma once

#include <cstdint>

#include "src/core/tensor.hpp"
#include "src/ops/rms_norm.hpp"
#include "src/ops/rope.hpp"

namespace meshtest {

/// Sizes and options of one attention block.
struct AttentionParams {
  std::int64_t num_heads = 0;       ///< query heads
  std::int64_t num_kv_heads = 0;    ///< key/value heads; divides num_heads
  std::int64_t head_dim = 0;        ///< d
  std::int64_t sliding_window = 0;  ///< 0: full causal (the model sets it on even layers)
  RopeParams rope;                  ///< rope.head_dim must equal head_dim
  double norm_eps = kRmsNormEps;
  /// Opt-in: the fused ops qkv_rope (linear + split_qkv + rope in one pass) and sdpa_sinks
  /// (flash-style sdpa) in place of the unfused sequence. Off by default: the unfused ops are
  /// the reference numerics (the published-model match). On, results equal the unfused ones to
  /// the fused ops' rounding (their headers say how far: bf16 a few ulps, f32 to rounding).
  bool fused = false;
};

/// Weights of one attention block (checkpoint names block.{n}.attn.*), all of one dtype except
/// norm_scale, which may be any floating dtype.
struct AttentionWeights {
  Tensor norm_scale;  ///< norm.scale   [hidden]
  Tensor qkv_weight;  ///< qkv.weight   [(heads + 2 kv_heads) * d, hidden]
  Tensor qkv_bias;    ///< qkv.bias     [(heads + 2 kv_heads) * d]
  Tensor sinks;       ///< sinks        [heads]
  Tensor out_weight;  ///< out.weight   [hidden, heads * d]
  Tensor out_bias;    ///< out.bias     [hidden]
};

/// q, k and v of a qkv projection, viewed as the reference does.
struct Qkv {
  Tensor q;  ///< [T, kv_heads, heads / kv_heads, d]
  Tensor k;  ///< [T, kv_heads, d]
  Tensor v;  ///< [T, kv_heads, d]
};

}  // namespace meshtest
