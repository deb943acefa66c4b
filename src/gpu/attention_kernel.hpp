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

/// One sequence of a batched launch (launch_sdpa_batch): its query rows are rows [row, row +
/// rows) of q and of the output, at positions q_offset + i; its keys and values are rows [0, tk)
/// of k and v (the stored type, [tk, kv_heads, head_dim] rows apart), at positions k_offset + j.
struct SdpaRun {
  std::int64_t row = 0, rows = 0, q_offset = 0;
  const void* k = nullptr;
  const void* v = nullptr;
  std::int64_t tk = 0, k_offset = 0;
};

/// The most sequences one launch_sdpa_batch takes (they travel in the kernel's parameters, so a
/// CUDA graph records them by value).
inline constexpr int kSdpaBatch = 64;

/// The sequences of one launch_sdpa_batch, passed to its kernels by value (__grid_constant__:
/// read in the parameter space where a kernel indexes it, never copied per thread).
struct SdpaBatch {
  SdpaRun seq[kSdpaBatch];
  int n;
};

/// Whether launch_sdpa_batch takes these shapes (either dtype): head_dim a power of two from 8
/// to 256 (a row read 16 bytes at a time, two elements a thread), at most 16 queries per kv
/// head.
bool sdpa_batch_fits(Float t, std::int64_t head_dim, std::int64_t q_per_kv);

/// The keys a chunk of launch_sdpa_batch takes: 256, halved (to 64 at the least) while the
/// launch would have fewer than 2048 blocks; and the chunks that covers the longest sequence.
void sdpa_batch_chunks(std::int64_t rows, std::int64_t kv_heads, std::int64_t most_keys,
                       std::int64_t& chunk_keys, std::int64_t& chunks);

/// Queues sdpa_sinks for `n` <= kSdpaBatch sequences at once (SdpaShape's tq, tk and offsets
/// unused: each sequence's own), split over the keys as launch_sdpa_sinks, for decode steps: a
/// block per (query row, kv head, chunk of chunk_keys keys) reads each key and value row once for
/// all the kv head's queries (a thread a key, then a thread a pair of value elements), writes the
/// chunk's scores, its softmax and its weighted values into `partials` (f32 [rows heads, chunks,
/// head_dim + 2], rows counted from seq[0].row; on tensor cores where sdpa_batch_flash_fits:
/// launch_sdpa_batch_flash), then the merge with the sink of launch_sdpa_sinks writes out rows
/// seq[0].row .. Only where sdpa_batch_fits. Returns the launch's error.
cudaError_t launch_sdpa_batch(Float t, const void* q, const SdpaRun* seq, int n, const void* sinks,
                              void* out, const SdpaShape& s, float* partials,
                              std::int64_t chunk_keys, std::int64_t chunks, cudaStream_t stream);

/// The fewest query rows for which sdpa_sinks takes the tensor-core kernel (below, the
/// split-key one: a decode step's single row gains nothing from 16-row tiles).
inline constexpr std::int64_t kFlashMinRows = 16;

/// Whether launch_sdpa_flash takes this attention: bf16, head_dim 64 or 128, at least
/// kFlashMinRows query rows, 16-byte aligned buffers, a GPU of compute capability 8.0 or later.
bool sdpa_flash_fits(Float t, const SdpaShape& s, const void* q, const void* k, const void* v,
                     const void* out);

/// Queues the same attention as launch_sdpa_sinks on tensor cores (attention_flash_kernel.cu):
/// a block of four warps per 64 query rows and two heads of a kv group (one where q_per_kv is
/// odd or head_dim is 128) runs an online softmax over all the keys its rows see, in tiles of
/// 64 (masked only where a tile cuts a row's keys); q·kᵀ and p·v are bf16 products summed in f32
/// (mma.sync m16n8k16), the weights p rounded to bf16 for the second (the one rounding the
/// split-key kernel does not have), the denominator summed from the unrounded weights, the sink
/// joined as there. Only where sdpa_flash_fits. Returns the launch's error.
cudaError_t launch_sdpa_flash(const void* q, const void* k, const void* v, const void* sinks,
                              void* out, const SdpaShape& s, cudaStream_t stream);

/// Whether launch_sdpa_batch_flash takes a batch: bf16, head_dim 64 or 128, at most 16 queries
/// per kv head, a GPU of compute capability 8.0 or later.
bool sdpa_batch_flash_fits(Float t, std::int64_t head_dim, std::int64_t q_per_kv);

/// The partials of launch_sdpa_batch (the same layout and chunks, `rows` the batch's query rows)
/// on tensor cores (attention_flash_kernel.cu): a warp per query row, kv head and chunk, the kv
/// head's queries one tile of 16 rows, the chunk's keys in tiles of 64 (the next one's loads in
/// flight); q·kᵀ and p·v bf16 products summed in f32, the weights rounded to bf16 for the second.
/// Only where sdpa_batch_flash_fits. Returns the launch's error.
cudaError_t launch_sdpa_batch_flash(const void* q, const SdpaBatch& b, const SdpaShape& s,
                                    float* partials, std::int64_t rows, std::int64_t chunk_keys,
                                    std::int64_t chunks, cudaStream_t stream);

}  // namespace meshtest::gpu::detail
