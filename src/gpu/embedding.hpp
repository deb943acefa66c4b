// embedding (GPU): the rows of a vocab shard of the embedding table for a list of tokens.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "src/gpu/device_tensor.hpp"

namespace meshtest::gpu {

/// The CPU embedding_shard (src/ops/embedding.hpp) on the GPU, queued on `stream`: row i is
/// shard[tokens[i] − first_id] where the id falls in the shard's rows, else zeros, exact copies;
/// summing every shard's result (a vocab-parallel all_reduce) gives the whole table's rows.
///   tokens: T ids in [0, vocab) on the host, shard: [rows, hidden] on the GPU  ->  [T, hidden]
/// The ids are copied to the GPU first (not capturable in a CUDA graph). Errors as the CPU op's
/// (an id outside [0, vocab) named with its position, shard rows outside the vocabulary, a shard
/// that is not [rows, hidden]). Asynchronous.
DeviceTensor embedding_shard(std::span<const std::int64_t> tokens, const DeviceTensor& shard,
                             std::int64_t first_id, std::int64_t vocab, cudaStream_t stream);

}  // namespace meshtest::gpu
