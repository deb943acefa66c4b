// sdpa: scaled dot-product attention with GQA, causal and sliding-window masks and sinks.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "src/core/tensor.hpp"

namespace meshtest {

/// Options of sdpa. Query row i sits at position q_offset + i and key row j at k_offset + j,
/// so a token-sharded caller passes its shard's offset and the gathered keys' offset.
struct SdpaOptions {
  std::int64_t sliding_window = 0;  ///< 0: none; else keys with q_pos - k_pos >= window masked
  std::int64_t q_offset = 0;        ///< position of query row 0
  std::int64_t k_offset = 0;        ///< position of key row 0
  std::optional<double> scale = std::nullopt;  ///< softmax scale; default 1/sqrt(head_dim)
};

/// gpt-oss attention core on any subset of heads (tensor parallel passes its local heads):
///   q: [Tq, kv_heads, q_per_kv, d], k: [Tk, kv_heads, d], v: [Tk, kv_heads, d],
///   sinks: [kv_heads * q_per_kv]  ->  [Tq, kv_heads * q_per_kv * d]
/// Head h = g * q_per_kv + m (the reference's q view) attends with kv head g (GQA). Its logits
/// are scale · q·k over the keys with k_pos <= q_pos (causal) and, when sliding_window > 0,
/// q_pos - k_pos < sliding_window; sinks[h] joins the softmax denominator only. Output column
/// block h holds head h. All tensors share one dtype; bf16 computes in f32 and rounds the
/// logits, the scaled logits, the softmax weights and the output to bf16, as the reference's
/// bf16 tensor ops do. A query that sees no key and has a -inf sink gets a zero output.
Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& sinks,
            const SdpaOptions& options = {});

/// The shape, dtype and option checks shared by sdpa and sdpa_sinks: q of rank 4 with
/// head_dim > 0, k [Tk, kv_heads, d], v like k, sinks [heads], one dtype, sliding_window >= 0
/// and a finite scale. Throws Error prefixed by `op`.
void check_sdpa_args(std::string_view op, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& sinks, const SdpaOptions& options);

}  // namespace meshtest
