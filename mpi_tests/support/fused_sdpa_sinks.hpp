// The sdpa_sinks case of the fused-op kit, shared by its CPU test (test_fused_sdpa_sinks.cpp)
// and its GPU test (gpu/test_gpu_fused_sdpa_sinks.cpp): the inputs and their TP placements, the
// module's reference (sdpa), the options of the module's layer and the error model; each test
// gives its own fused function.
#pragma once

#include <vector>

#include "dist/testing/fused/fused_op.hpp"
#include "mpi_tests/support/fused_gpt_oss.hpp"
#include "src/ops/sdpa.hpp"

namespace meshtest::dist::fused_test {

/// Inputs q [Tq, KV, H/KV, d], k, v [Tk, KV, d] (Shard(1): a device's kv heads) and sinks [H]
/// (Shard(0)); output [Tq, H d] (Shard(1)). Prefill: Tq = Tk = seqlen; decode: one query after
/// kDecodeContext cached keys (Tk = kDecodeContext + 1).
inline testing::FusedInputs sdpa_sinks_inputs(const FusedSetup& s) {
  const GptOssConfig c = config(s);
  const std::int64_t tq = tokens(s), tk = keys(s), kv = c.num_key_value_heads;
  const std::int64_t per_kv = c.num_attention_heads / kv, d = c.head_dim;
  const Placements heads = placements_1d(Shard{1});
  return {
      .inputs = {{.name = "q", .full = activation(s, {tq, kv, per_kv, d}, 1), .placements = heads},
                 {.name = "k", .full = activation(s, {tk, kv, d}, 2), .placements = heads},
                 {.name = "v", .full = activation(s, {tk, kv, d}, 3), .placements = heads},
                 {.name = "sinks",
                  .full = attention_weights(s, c, {"sinks"}).sinks,
                  .placements = placements_1d(Shard{0})}},
      .outputs = {heads}};
}

/// The module's layer's options: its sliding window, the queries after the cached keys.
inline SdpaOptions sdpa_sinks_options(const FusedSetup& s) {
  return {.sliding_window = config(s).layer_sliding_window(kLayer), .q_offset = first_position(s)};
}

/// The module's op (attention_block): sdpa.
inline std::vector<Tensor> sdpa_sinks_reference(const FusedSetup& s,
                                                const std::vector<Tensor>& in) {
  return {sdpa(in[0], in[1], in[2], in[3], sdpa_sinks_options(s))};
}

/// The flash form adds q.k, the softmax's sum and weights.v in other blocks (online softmax)
/// than sdpa. n: q.k over head_dim, then the softmax's sum and weights.v over the keys (masked
/// keys add zeros) and the sink; r: sdpa's bf16 logits, scaled logits and weights, each read by
/// the next step (the flash form rounds its output only; on GPU tensor cores also its weights
/// before p·v: two roundings, within the three r counts for each side).
inline ErrorModel sdpa_sinks_model(const FusedSetup& s) {
  return {.dtype = kDtype,
          .terms = config(s).head_dim + keys(s) + 1,
          .roundings = 3,
          .reference = Reference::other_order};
}

/// The case on the default mesh (1 x N, or MESHTEST_FUSED_MESH) with `fused` as the op.
inline testing::FusedOpCase sdpa_sinks_case(std::string name, testing::FusedFn fused) {
  return testing::FusedOpCase{
      .name = std::move(name),
      .expected_pcc = 0.999,
      .model = sdpa_sinks_model,
      .checkpoint_tensors = {attn_name("sinks")},
      .make_inputs = sdpa_sinks_inputs,
      .reference = sdpa_sinks_reference,
      .fused = std::move(fused),
  };
}

}  // namespace meshtest::dist::fused_test
