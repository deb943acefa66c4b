// sdpa (GPU): gpt-oss's scaled-dot-product attention with learned sinks on DeviceTensors.
#pragma once

#include <cuda_runtime_api.h>

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

}  // namespace meshtest::gpu
