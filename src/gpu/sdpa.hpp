// sdpa (GPU): gpt-oss's scaled-dot-product attention with learned sinks on DeviceTensors.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "src/gpu/attention_kernel.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/ops/sdpa.hpp"

namespace meshtest::gpu {

/// The CPU sdpa_sinks (src/ops/sdpa_sinks.hpp) on the GPU, queued on `stream`: the same shapes,
/// options and masking rule (causal; with o.sliding_window, q_pos - k_pos < window; query row i at
/// o.q_offset + i, key row j at o.k_offset + j, so a decode step is one query row at the cache's
/// length against the cache's keys), GQA (head h = g q_per_kv + m attends with kv head g), the
/// sink joining each head's softmax denominator only.
///   q: [Tq, kv_heads, q_per_kv, d], k, v: [Tk, kv_heads, d], sinks: [kv_heads q_per_kv]
///   ->  [Tq, kv_heads q_per_kv d]
/// Flash-style, never forming the Tq x Tk logits: the keys a row sees are split into chunks
/// (as many as fill the GPU, of at least 64 keys: one when the rows and heads fill it), a warp
/// per row, head and chunk runs an online softmax over its keys, four at a time, and a warp per
/// row and head merges the chunks with the sink; memory is the inputs, the output and the
/// chunks' partials (f32, head_dim + 2 a chunk), and a window costs O(Tq · window). No tensor
/// cores yet (docs/gpt-oss-gpu.md, Bench). f32 and bf16 compute in f32 and
/// round the output once, as the CPU's sdpa_sinks; the sums run in another order than the
/// CPU's: within the error model. A row that sees no key and has a -inf sink gets zeros.
/// Errors as the CPU op's (shapes, dtypes, a negative window, a scale that is not finite), and
/// for a head_dim above 256, another dtype, or tensors on another device than q's. The perf
/// record ("sdpa_sinks") is timed on the stream. Asynchronous.
DeviceTensor sdpa_sinks(const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                        const DeviceTensor& sinks, cudaStream_t stream, const SdpaOptions& o = {});

/// The fewest query rows sdpa_sinks runs on tensor cores (bf16, head_dim 64 or 128): below, a
/// decode step's few rows are better served split over the keys (sdpa_sinks_batch).
inline constexpr std::int64_t kSdpaTensorCoreRows = detail::kFlashMinRows;

/// One sequence of sdpa_sinks_batch: the next `rows` query rows, at positions q_offset + i,
/// attending over rows [key_begin, key_end) of `keys` and `values` ([n, kv_heads, head_dim], for
/// a decode step a DeviceKvCache's buffers read in place), row key_begin at position k_offset.
struct SdpaSequence {
  std::int64_t rows = 0;
  std::int64_t q_offset = 0;
  const DeviceTensor* keys = nullptr;
  const DeviceTensor* values = nullptr;
  std::int64_t key_begin = 0, key_end = 0;
  std::int64_t k_offset = 0;
};

/// sdpa_sinks for a batch of sequences in one go, the way a batch decode step attends: q's rows
/// are the sequences' rows in order (their rows sum to Tq), each attending over its own keys
/// with the masking rule of sdpa_sinks (o.sliding_window and o.scale shared; o.q_offset and
/// o.k_offset must be 0: each sequence has its own). Split over the keys: a block per query row,
/// kv head and chunk of keys reads each key and value once for all the kv head's queries, and
/// the chunks are merged with the sink as in sdpa_sinks; launches of up to 64 sequences. Shapes
/// whose head vectors do not split into 16-byte loads run one sdpa_sinks per sequence instead.
/// f32 compute, the output rounded once (bf16 at head_dim 64 and 128 on tensor cores, which
/// round the weights before p·v too): within the model of the CPU's sdpa_sinks per sequence.
/// Errors as sdpa_sinks', and for a sequence without keys or values, with keys of another
/// shape, dtype or device, a key range outside its rows, negative rows, or rows that do not sum
/// to Tq. The perf record ("sdpa_sinks") is timed on the stream. Asynchronous.
DeviceTensor sdpa_sinks_batch(const DeviceTensor& q, std::span<const SdpaSequence> sequences,
                              const DeviceTensor& sinks, cudaStream_t stream,
                              const SdpaOptions& o = {});

}  // namespace meshtest::gpu
