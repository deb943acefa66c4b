// The error model's counts for the gpt-oss blocks.
#include "src/check/gpt_oss_chains.hpp"

namespace meshtest {

ErrorModel Chain::model(DType dtype, Reference reference) const {
  return {.dtype = dtype,
          .terms = terms,
          .roundings = dtype == DType::bf16 ? bf16_roundings : 0,
          .reference = reference};
}

Chain attention_chain(const GptOssConfig& c, std::int64_t keys, int tp) {
  const std::int64_t h = c.hidden_size;
  return {.terms = h + (h + 1) + c.head_dim + (keys + 1) + keys +
                   (c.num_attention_heads * c.head_dim + 1 + tp) + 1,
          .bf16_roundings = 1 + 1 + 3 + 4 + 2};
}

Chain experts_chain(std::int64_t hidden, std::int64_t intermediate, std::int64_t k, int tp) {
  return {.terms = (hidden + 1) + (hidden + 1) + (intermediate + tp) + 2 * k,
          .bf16_roundings = 1 + 1 + 1 + 1 + 5 + 2 + 1};
}

Chain experts_chain(const GptOssConfig& c, int tp) {
  return experts_chain(c.hidden_size, c.intermediate_size, c.experts_per_token, tp);
}

Chain mlp_chain(const GptOssConfig& c, int tp) {
  const Chain e = experts_chain(c, tp);
  return {.terms = c.hidden_size + e.terms + 1, .bf16_roundings = 1 + e.bf16_roundings + 1};
}

Chain block_chain(const GptOssConfig& c, std::int64_t keys, int tp) {
  const Chain a = attention_chain(c, keys, tp), m = mlp_chain(c, tp);
  return {.terms = a.terms + m.terms, .bf16_roundings = a.bf16_roundings + 1 + m.bf16_roundings};
}

Chain model_chain(const GptOssConfig& c, std::int64_t tokens, int tp) {
  const Chain b = block_chain(c, tokens, tp);
  return {.terms = tp + c.num_hidden_layers * b.terms + 2 * c.hidden_size,
          .bf16_roundings = c.num_hidden_layers * (b.bf16_roundings + 1) + 1};
}

}  // namespace meshtest
