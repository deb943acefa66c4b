// embedding: token ids to rows of an embedding table.
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

}  // namespace meshtest
