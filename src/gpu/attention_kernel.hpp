// attention_kernel: what sdpa.cpp hands to the kernel of attention_kernel.cu. Plain types only,
// so that nvcc compiles no Eigen or fmt.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "src/gpu/elementwise_kernel.hpp"

namespace meshtest::gpu::detail {

/// The shapes and options of one scaled-dot-product attention with sinks (sdpa.hpp).
struct SdpaShape {
  std::int64_t tq = 0, tk = 0, kv_heads = 0, q_per_kv = 0, head_dim = 0;
  std::int64_t q_offset = 0, k_offset = 0;
  std::int64_t sliding_window = 0;  ///< 0: none
  float scale = 1;
};

/// The largest head_dim the kernel takes (each lane of a warp holds up to head_dim / 32 values).
inline constexpr std::int64_t kSdpaMaxHeadDim = 256;

/// How many chunks launch_sdpa_sinks splits each query row's keys into: enough warps to fill
/// the GPU, chunks of at least 64 keys (1 when the rows and heads alone fill it).
std::int64_t sdpa_chunks(const SdpaShape& s);

/// Queues out [tq, heads d] = softmax-with-sink(scale q kᵀ, masked) v for every query row and
/// head, flash-style, never forming the logits: each row's keys (k_pos <= q_pos and, with a
/// window, q_pos - k_pos < window) are split into `chunks` (sdpa_chunks(s)) of consecutive
/// keys; a warp per (row, head, chunk) runs an online softmax over its keys (each q·k the
/// lanes' products summed by shuffles, four keys at a time), into `partials` (f32 [tq heads,
/// chunks, head_dim + 2]: its unnormalized output, max and denominator); a warp per (row, head)
/// merges them with the sink (the max started at the sink logit, exp(sink − max) joining the
/// denominator only; none for a -inf sink), in f32, the output rounded once to the stored type; a
/// row that sees no key and has a -inf sink gets zeros. q [tq, kv_heads, q_per_kv, d], k and v [tk,
/// kv_heads, d], sinks [heads] (the stored type). 1 <= head_dim <= kSdpaMaxHeadDim. Returns the
/// launch's error.
cudaError_t launch_sdpa_sinks(Float t, const void* q, const void* k, const void* v,
                              const void* sinks, void* out, const SdpaShape& s, float* partials,
                              std::int64_t chunks, cudaStream_t stream);

}  // namespace meshtest::gpu::detail
