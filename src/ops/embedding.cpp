// embedding: row gather, whole table or a vocab shard.
#include "src/ops/embedding.hpp"

#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

void check_tokens(std::span<const std::int64_t> tokens, std::int64_t vocab) {
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    MESHTEST_CHECK(tokens[i] >= 0 && tokens[i] < vocab,
                   "embedding: token {} at position {} is outside the vocabulary [0, {})",
                   tokens[i], i, vocab);
  }
}

}  // namespace

Tensor embedding(std::span<const std::int64_t> tokens, const Tensor& table) {
  detail::check_rank("embedding", "table ([vocab, hidden])", table, 2);
  return embedding_shard(tokens, table, 0, table.shape()[0]);
}

Tensor embedding_shard(std::span<const std::int64_t> tokens, const Tensor& shard,
                       std::int64_t first_id, std::int64_t vocab) {
  perf::OpScope scope("embedding");
  scope.input(shard).attr("tokens", tokens.size()).attr("first_id", first_id).attr("vocab", vocab);
  detail::check_rank("embedding", "table ([vocab, hidden])", shard, 2);
  const std::int64_t rows = shard.shape()[0];
  check_embedding_shard(tokens, first_id, rows, vocab);
  const auto tokens_n = static_cast<std::int64_t>(tokens.size());
  Tensor out(Shape{tokens_n, shard.shape()[1]}, shard.dtype());
  for (std::int64_t i = 0; i < tokens_n; ++i) {
    const std::int64_t row = tokens[i] - first_id;
    if (row >= 0 && row < rows) out.assign_slice(0, i, shard.slice(0, row, 1));
  }
  scope.output(out).bytes(static_cast<std::int64_t>(out.nbytes()));
  return out;
}

void check_embedding_shard(std::span<const std::int64_t> tokens, std::int64_t first_id,
                           std::int64_t rows, std::int64_t vocab) {
  MESHTEST_CHECK(first_id >= 0 && first_id + rows <= vocab,
                 "embedding: shard rows [{}, {}) are outside the vocabulary [0, {})", first_id,
                 first_id + rows, vocab);
  check_tokens(tokens, vocab);
}

}  // namespace meshtest
