// Fuzz target gpt_oss_config: parse_config (a checkpoint's config.json), then the per-op
// parameters a model derives from it.
#include "src/models/checkpoint.hpp"
#include "tests/fuzz/fuzz_target.hpp"

using namespace meshtest;

MESHTEST_FUZZ_TARGET(in) {
  const GptOssConfig c = parse_config(in.text(), "fuzz/config.json");
  fuzz::must([&] { c.validate(); });
  const YarnFrequencies f = fuzz::must([&] { return yarn_frequencies(c.rope_params()); });
  fuzz::require(static_cast<std::int64_t>(f.inv_freq.size()) == c.head_dim / 2,
                "one RoPE frequency per pair of head dims");
  for (std::int64_t layer : {std::int64_t{0}, c.num_hidden_layers - 1}) {
    fuzz::require(c.attention_params(layer).head_dim == c.head_dim, "attention has head_dim");
  }
  fuzz::require(c.moe_params().experts_per_token <= c.num_experts, "top-k within the experts");
}
