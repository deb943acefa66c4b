// embedding: row gather.
#include "src/ops/embedding.hpp"

#include "src/ops/compute.hpp"

namespace meshtest {

Tensor embedding(std::span<const std::int64_t> tokens, const Tensor& table) {
  detail::check_rank("embedding", "table ([vocab, hidden])", table, 2);
  const std::int64_t vocab = table.shape()[0];
  const auto tokens_n = static_cast<std::int64_t>(tokens.size());
  for (std::int64_t i = 0; i < tokens_n; ++i) {
    MESHTEST_CHECK(tokens[i] >= 0 && tokens[i] < vocab,
                   "embedding: token {} at position {} is outside the vocabulary [0, {})",
                   tokens[i], i, vocab);
  }
  Tensor out(Shape{tokens_n, table.shape()[1]}, table.dtype());
  for (std::int64_t i = 0; i < tokens_n; ++i) {
    out.assign_slice(0, i, table.slice(0, tokens[i], 1));
  }
  return out;
}

}  // namespace meshtest
