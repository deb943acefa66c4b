// The attention sections of meshtest-bench fused: sdpa_sinks (flash-style, src/ops/sdpa_sinks.hpp)
// against the attention block's sdpa, and qkv_rope (src/ops/qkv_rope.hpp) against its linear +
// split_qkv + rope, single device, random inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "src/core/dtype.hpp"
#include "src/ops/qkv_rope.hpp"

namespace meshtest::bench {

/// Sizes and repetitions of the attention sections. The defaults are gpt-oss-20b's attention
/// shapes: 64 query heads, 8 kv heads, head_dim 64, the sliding window 128 of its even layers,
/// hidden 2880, at prefill 1024.
struct AttentionBenchOptions {
  std::vector<std::int64_t> sdpa_tokens = {1024};  ///< prefill lengths of the sdpa section
  std::int64_t qkv_tokens = 1024;                  ///< prefill length of the qkv_rope section
  std::int64_t heads = 64;
  std::int64_t kv_heads = 8;   ///< divides heads
  std::int64_t head_dim = 64;  ///< even (RoPE)
  std::int64_t window = 128;   ///< the sliding window; each length also runs full causal
  std::int64_t hidden = 2880;
  std::int64_t qkv_row_block = QkvRopeOptions{}.row_block;        ///< qkv_rope's token panel
  std::int64_t qkv_column_block = QkvRopeOptions{}.column_block;  ///< qkv_rope's weight block
  DType dtype = DType::f32;
  int iters = 3;   ///< measured calls per figure (median and min reported)
  int warmup = 1;  ///< warm-up calls per figure; the first call (a warm-up when >= 1) is the
                   ///< one whose peak heap is reported
  std::uint64_t seed = 12;
};

/// Throws Error naming the option: a size < 1, kv_heads not dividing heads, an odd head_dim,
/// a negative window, a qkv_rope block < 1, iters < 1 or warmup < 0.
void check_attention_options(const AttentionBenchOptions& o);

/// For each length T of o.sdpa_tokens and each mask (the sliding window, full causal):
/// q [T, kv_heads, heads / kv_heads, head_dim], k, v [T, kv_heads, head_dim] and sinks [heads]
/// seeded; times sdpa (the reference: one head at a time through a T x T logits matrix) and
/// sdpa_sinks, and measures the peak heap bytes inside one call of each (bench::HeapWindow);
/// prints the times, the peaks, their ratios, the T² and T·d figures that the peaks scale with,
/// and the issue-12 targets (fused faster; its peak O(T·d), not O(T²)). The reference is
/// skipped, saying how many bytes it needs, when that exceeds half the available memory.
/// Returns whether every output agreed with the reference (max error / max |ref| within the
/// dtype's bound). Throws as check_attention_options.
bool sdpa_section(const AttentionBenchOptions& o);

/// x [qkv_tokens, hidden], weight [(heads + 2 kv_heads) head_dim, hidden] and bias seeded; times
/// qkv_rope and the reference sequence (linear, split_qkv, rope with gpt-oss-20b's YaRN
/// parameters at head_dim) and the sequence's linear alone, prints the times, the ratios and
/// the issue-12 target (>= 1.1 x). qkv_rope runs with qkv_row_block and qkv_column_block.
/// Returns whether q, k and v agreed. Throws as check_attention_options.
bool qkv_rope_section(const AttentionBenchOptions& o);

}  // namespace meshtest::bench
