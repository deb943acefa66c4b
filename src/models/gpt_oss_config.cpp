// GptOssConfig: published configs, validation and the per-op parameters.
#include "src/models/gpt_oss_config.hpp"

#include <cmath>

namespace meshtest {

GptOssConfig GptOssConfig::gpt_oss_20b() { return GptOssConfig{}; }

GptOssConfig GptOssConfig::gpt_oss_120b() {
  GptOssConfig c;
  c.num_hidden_layers = 36;
  c.num_experts = 128;
  return c;
}

GptOssConfig GptOssConfig::tiny() {
  GptOssConfig c;
  c.vocab_size = 128;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.num_experts = 4;
  c.experts_per_token = 2;
  c.intermediate_size = 32;
  c.sliding_window = 4;
  return c;
}

GptOssConfig GptOssConfig::tiny_tp() {
  GptOssConfig c = tiny();
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.head_dim = 8;
  return c;
}

void GptOssConfig::validate() const {
  const auto size = [](const char* name, std::int64_t v) {
    MESHTEST_CHECK(v > 0 && v <= kMaxSize, "gpt-oss config: {} is {}, expected 1 .. {}", name, v,
                   kMaxSize);
  };
  size("vocab_size", vocab_size);
  size("hidden_size", hidden_size);
  size("num_hidden_layers", num_hidden_layers);
  size("num_attention_heads", num_attention_heads);
  size("num_key_value_heads", num_key_value_heads);
  size("head_dim", head_dim);
  size("num_experts", num_experts);
  size("experts_per_token", experts_per_token);
  size("intermediate_size", intermediate_size);
  MESHTEST_CHECK(initial_context_length > 0,
                 "gpt-oss config: initial_context_length is {}, expected > 0",
                 initial_context_length);
  MESHTEST_CHECK(sliding_window >= 0, "gpt-oss config: sliding_window is {}, expected >= 0",
                 sliding_window);
  MESHTEST_CHECK(num_attention_heads % num_key_value_heads == 0,
                 "gpt-oss config: num_attention_heads {} is not a multiple of "
                 "num_key_value_heads {}",
                 num_attention_heads, num_key_value_heads);
  MESHTEST_CHECK(experts_per_token <= num_experts,
                 "gpt-oss config: experts_per_token {} exceeds num_experts {}", experts_per_token,
                 num_experts);
  MESHTEST_CHECK(std::isfinite(swiglu_limit) && swiglu_limit > 0 && std::isfinite(swiglu_alpha),
                 "gpt-oss config: swiglu_limit {} must be finite and > 0, swiglu_alpha {} finite",
                 swiglu_limit, swiglu_alpha);
  MESHTEST_CHECK(std::isfinite(norm_eps) && norm_eps >= 0,
                 "gpt-oss config: norm_eps is {}, expected a finite value >= 0", norm_eps);
  yarn_frequencies(rope_params());  // checks head_dim, theta, scaling and low/high
}

std::int64_t GptOssConfig::layer_sliding_window(std::int64_t layer) const {
  MESHTEST_CHECK(layer >= 0 && layer < num_hidden_layers,
                 "gpt-oss config: layer {} is outside [0, {})", layer, num_hidden_layers);
  return layer % 2 == 0 ? sliding_window : 0;
}

RopeParams GptOssConfig::rope_params() const {
  return {.head_dim = head_dim,
          .theta = rope_theta,
          .scaling_factor = rope_scaling_factor,
          .initial_context_length = initial_context_length,
          .ntk_alpha = rope_ntk_alpha,
          .ntk_beta = rope_ntk_beta};
}

AttentionParams GptOssConfig::attention_params(std::int64_t layer) const {
  return {.num_heads = num_attention_heads,
          .num_kv_heads = num_key_value_heads,
          .head_dim = head_dim,
          .sliding_window = layer_sliding_window(layer),
          .rope = rope_params(),
          .norm_eps = norm_eps};
}

MoeParams GptOssConfig::moe_params() const {
  return {.experts_per_token = experts_per_token,
          .swiglu_alpha = swiglu_alpha,
          .swiglu_limit = swiglu_limit,
          .norm_eps = norm_eps};
}

}  // namespace meshtest
