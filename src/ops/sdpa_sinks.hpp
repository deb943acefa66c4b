// sdpa_sinks: sdpa (sinks, causal and sliding-window masks, GQA) computed flash-style.
#pragma once

#include <cstdint>

#include "src/core/tensor.hpp"
#include "src/ops/sdpa.hpp"

namespace meshtest {

/// Default tile edge of sdpa_sinks: queries per query tile and keys per key block.
inline constexpr std::int64_t kSdpaSinksBlock = 64;

/// The fused form of sdpa, a drop-in with the same shapes, options and masking rule:
///   q: [Tq, kv_heads, q_per_kv, d], k: [Tk, kv_heads, d], v: [Tk, kv_heads, d],
///   sinks: [kv_heads * q_per_kv]  ->  [Tq, kv_heads * q_per_kv * d]
/// Head h = g * q_per_kv + m attends with kv head g; query row i sits at q_offset + i and key
/// row j at k_offset + j; key_visible (attention_mask.hpp) decides which keys a query sees.
///
/// Flash-style: for each kv head, a tile of `block` queries times its q_per_kv heads meets the
/// keys in blocks of `block`, and an online softmax keeps per row a running max (started at the
/// sink logit), a running denominator (started at exp(0) for the sink, 0 for a -inf sink) and a
/// rescaled output accumulator. Key blocks that no query of the tile sees (past the causal edge
/// or before the window) are skipped, so a sliding window costs O(Tq · window) instead of
/// O(Tq · Tk). A query that sees no key gets a zero output (with a -inf sink, as sdpa).
///
/// Working memory: O(block · q_per_kv · (d + block)) values per call, reused across heads and
/// tiles; no Tq x Tk matrix at any block size below Tk (bf16 adds f32 copies of k and v, the
/// size of the inputs: O(Tk · kv_heads · d)).
///
/// Dtypes: all tensors share one dtype. f64 computes in f64 and f32 in f32; the result equals
/// sdpa's to rounding (the softmax is accumulated in a different order). bf16 computes in f32
/// and rounds only the output, once; sdpa rounds the logits, the scaled logits, the softmax
/// weights and the output to bf16 (the reference model's per-op rounding), so bf16 results are
/// closer to the exact value than sdpa's and may differ from them by a few bf16 ulps.
///
/// Traceable: while a perf::Trace captures, the call records a compute step that reruns the
/// attention from the buffers of q, k, v and sinks into the output's, with the options fixed
/// at capture and no validation or allocation (the tile and bf16 copies are the step's).
///
/// Throws Error (naming the tensor) for q not of rank 4, k not of rank 3, head_dim 0, k, v or
/// sinks whose shape or dtype does not fit q, a dtype other than f32, f64 or bf16, a negative
/// sliding_window, a non-finite scale, or block < 1.
Tensor sdpa_sinks(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& sinks,
                  const SdpaOptions& options = {}, std::int64_t block = kSdpaSinksBlock);

}  // namespace meshtest
