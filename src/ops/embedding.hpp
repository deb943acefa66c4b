// embedding: token ids to rows of an embedding table (whole, or a vocab shard of it).
#pragma once

#include <cstdint>
#include <span>

#include "src/core/tensor.hpp"

namespace meshtest {

/// Row tokens[i] of the table for every i (an exact copy, the table's dtype).
///   tokens: T ids in [0, vocab), table: [vocab, hidden]  ->  [T, hidden]
/// Throws Error naming the position and value of an id outside [0, vocab). T = 0 gives an empty
/// [0, hidden] tensor (a token shard may be empty).
Tensor embedding(std::span<const std::int64_t> tokens, const Tensor& table);

/// The rows of a vocab shard: rows [first_id, first_id + rows) of a [vocab, hidden] table.
///   tokens: T ids in [0, vocab), shard: [rows, hidden]  ->  [T, hidden]
/// Row i is shard[tokens[i] - first_id] when the id falls in the shard, else zeros; summing the
/// results of all shards (a vocab-parallel all_reduce) gives embedding() exactly. Throws Error
/// naming the position and value of an id outside [0, vocab), or a shard outside the vocab.
Tensor embedding_shard(std::span<const std::int64_t> tokens, const Tensor& shard,
                       std::int64_t first_id, std::int64_t vocab);

/// embedding_shard's checks of a shard of `rows` rows from first_id and of the tokens, for the
/// GPU op of the same contract (src/gpu/embedding.hpp). Throws its Errors.
void check_embedding_shard(std::span<const std::int64_t> tokens, std::int64_t first_id,
                           std::int64_t rows, std::int64_t vocab);

}  // namespace meshtest
