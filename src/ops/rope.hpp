// rope: rotary position embedding with YaRN (NTK-by-parts) scaling, as gpt-oss.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "src/core/tensor.hpp"

namespace meshtest {

/// RoPE parameters of gpt-oss (defaults: the published 20b/120b values).
struct RopeParams {
  std::int64_t head_dim = 64;                  ///< d; even
  double theta = 150000.0;                     ///< base of freq = base^(2j/d)
  double scaling_factor = 32.0;                ///< YaRN s; s <= 1 gives plain RoPE
  std::int64_t initial_context_length = 4096;  ///< L
  double ntk_alpha = 1.0;                      ///< α: the high end of the NTK-by-parts band
  double ntk_beta = 32.0;                      ///< β: the low end
};

/// The YaRN frequencies of RopeParams. For s > 1:
///   freq_j = base^(2j/d), j = 0 .. d/2-1;   concentration = 0.1 ln(s) + 1;
///   low = (d/2) ln(L/(β 2π)) / ln(base);   high = (d/2) ln(L/(α 2π)) / ln(base);
///   mask_j = 1 - clamp((j - low)/(high - low), 0, 1);
///   inv_freq_j = 1/(s freq_j) (1 - mask_j) + (1/freq_j) mask_j.
/// For s <= 1: concentration = 1, inv_freq_j = 1/freq_j, low = high = 0.
struct YarnFrequencies {
  double concentration = 1.0;
  double low = 0.0;
  double high = 0.0;
  std::vector<double> inv_freq;  ///< [d/2]
};

/// YaRN frequencies computed in `dtype`'s compute type: f32 for f32 and bf16 (as the
/// reference does), f64 for f64; returned as doubles. Throws Error for bad parameters and,
/// for s > 1, unless 0 < low < high < d/2 - 1 (the reference's assertion).
YarnFrequencies yarn_frequencies(const RopeParams& p, DType dtype = DType::f64);

/// cos and sin of every (position, frequency), both multiplied by the concentration.
///   cos, sin: [T, d/2], dtype as asked (bf16 tables are rounded from f32, as the reference
///   casts them to the activation dtype). Row i is position `position_offset + i`.
struct RopeTable {
  Tensor cos;
  Tensor sin;
};

/// The table of positions position_offset .. position_offset + num_tokens - 1.
RopeTable rope_table(const RopeParams& p, std::int64_t num_tokens, std::int64_t position_offset,
                     DType dtype);

/// Half-split rotation of every head vector of token i by table row i:
///   (x1, x2) = halves of the last dim;  out = (x1 cos - x2 sin, x2 cos + x1 sin).
///   x: [T, ..., d] (e.g. [T, heads, d] or [T, kv_heads, q_per_kv, d])  ->  same shape
/// The table must have T rows, d/2 columns and x's dtype. bf16 rounds every product and sum
/// to bf16, as the reference's bf16 tensor ops do.
Tensor apply_rope(const Tensor& x, const RopeTable& table);

/// RoPE of queries and keys at positions position_offset .. position_offset + T - 1.
///   q: [T, ..., d], k: [T, ..., d]  ->  (q rotated, k rotated), same shapes.
std::pair<Tensor, Tensor> rope(const Tensor& q, const Tensor& k, const RopeParams& p,
                               std::int64_t position_offset = 0);

}  // namespace meshtest
