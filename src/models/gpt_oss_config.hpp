// GptOssConfig: the sizes of a gpt-oss model; the published 20b/120b configs and a tiny one.
#pragma once

#include <cstdint>

#include "src/ops/attention.hpp"
#include "src/ops/moe/moe.hpp"
#include "src/ops/rope.hpp"

namespace meshtest {

/// A gpt-oss configuration; field names follow the reference ModelConfig / config.json.
/// The defaults are gpt-oss-20b.
struct GptOssConfig {
  /// The largest size validate() accepts for each of vocab_size .. intermediate_size: every
  /// weight's element count then fits in int64, and a config read from a file cannot ask for
  /// absurd allocations (the RoPE table has head_dim / 2 entries).
  static constexpr std::int64_t kMaxSize = std::int64_t{1} << 20;

  std::int64_t vocab_size = 201088;
  std::int64_t hidden_size = 2880;
  std::int64_t num_hidden_layers = 24;
  std::int64_t num_attention_heads = 64;
  std::int64_t num_key_value_heads = 8;
  std::int64_t head_dim = 64;
  std::int64_t num_experts = 32;
  std::int64_t experts_per_token = 4;
  std::int64_t intermediate_size = 2880;
  std::int64_t sliding_window = 128;  ///< applied on even layers only
  std::int64_t initial_context_length = 4096;
  double rope_theta = 150000.0;
  double rope_scaling_factor = 32.0;
  double rope_ntk_alpha = 1.0;
  double rope_ntk_beta = 32.0;
  double swiglu_limit = 7.0;
  double swiglu_alpha = 1.702;
  double norm_eps = 1e-5;

  /// gpt-oss-20b: 24 layers, 32 experts (the rest as the defaults).
  static GptOssConfig gpt_oss_20b();
  /// gpt-oss-120b: 36 layers, 128 experts (the rest as 20b).
  static GptOssConfig gpt_oss_120b();
  /// For tests: vocab 128, hidden 64, 2 layers, 4 q / 2 kv heads of 16, 4 experts top-2,
  /// intermediate 32, sliding window 4, the published RoPE/YaRN values (low ≈ 2.0, high ≈ 4.4
  /// for head_dim 16).
  static GptOssConfig tiny();
  /// For tensor-parallel tests: tiny() with 16 q / 8 kv heads of 8, so heads and the
  /// intermediate (32) split over 1, 2, 4 and 8 devices (not 3).
  static GptOssConfig tiny_tp();

  /// Throws Error naming the first field that is out of range (sizes 1 .. kMaxSize) or
  /// inconsistent (including the YaRN low/high condition).
  void validate() const;

  /// The sliding window of layer `layer`: sliding_window on even layers, 0 (none) on odd ones.
  std::int64_t layer_sliding_window(std::int64_t layer) const;
  RopeParams rope_params() const;
  AttentionParams attention_params(std::int64_t layer) const;
  MoeParams moe_params() const;
};

}  // namespace meshtest
