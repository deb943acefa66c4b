// test_fused_sdpa_sinks: the flash-style sdpa_sinks against the attention block's sdpa, in its
// TP form (each device's kv heads and their q heads and sinks: no CCL), over the fused-op kit's
// grid (dist/testing/fused/fused_op.hpp), with the gpt-oss module's config, dtype and layer
// (an even layer: the sliding window applies).
#include "dist/testing/fused/fused_op.hpp"
#include "mpi_tests/support/fused_gpt_oss.hpp"
#include "src/ops/sdpa.hpp"
#include "src/ops/sdpa_sinks.hpp"

namespace meshtest::dist::fused_test {
namespace {

/// Inputs q [Tq, KV, H/KV, d], k, v [Tk, KV, d] (Shard(1): a device's kv heads) and sinks [H]
/// (Shard(0)); output [Tq, H d] (Shard(1)). Prefill: Tq = Tk = seqlen; decode: one query after
/// kDecodeContext cached keys (Tk = kDecodeContext + 1).
testing::FusedInputs sdpa_sinks_inputs(const FusedSetup& s) {
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

SdpaOptions options(const FusedSetup& s) {
  return {.sliding_window = config(s).layer_sliding_window(kLayer), .q_offset = first_position(s)};
}

/// The module's op (attention_block): sdpa.
std::vector<Tensor> sdpa_sinks_reference(const FusedSetup& s, const std::vector<Tensor>& in) {
  return {sdpa(in[0], in[1], in[2], in[3], options(s))};
}

std::vector<Tensor> sdpa_sinks_fused(const FusedSetup& s, const MeshDevice&,
                                     const std::vector<Tensor>& local) {
  return testing::fused_outputs(sdpa_sinks(local[0], local[1], local[2], local[3], options(s)));
}

/// sdpa_sinks adds q.k, the softmax's sum and weights.v in other blocks (online softmax) than
/// sdpa. n: q.k over head_dim, then the softmax's sum and weights.v over the keys (masked keys
/// add zeros) and the sink; r: sdpa's bf16 logits, scaled logits and weights, each read by the
/// next step (sdpa_sinks rounds its output only).
ErrorModel sdpa_sinks_model(const FusedSetup& s) {
  return {.dtype = kDtype,
          .terms = config(s).head_dim + keys(s) + 1,
          .roundings = 3,
          .reference = Reference::other_order};
}

}  // namespace

/// The case on the default mesh (1 x N, or MESHTEST_FUSED_MESH).
static testing::FusedOpCase sdpa_sinks_case() {
  return testing::FusedOpCase{
      .name = "sdpa_sinks",
      .expected_pcc = 0.999,
      .model = sdpa_sinks_model,
      .checkpoint_tensors = {attn_name("sinks")},
      .make_inputs = sdpa_sinks_inputs,
      .reference = sdpa_sinks_reference,
      .fused = sdpa_sinks_fused,
  };
}

MESHTEST_FUSED_OP_TESTS(sdpa_sinks, sdpa_sinks_case());
// The same case fixed on the seed's 4x8 mesh (on_seed_mesh).
MESHTEST_FUSED_OP_TESTS(sdpa_sinks_on_4x8, on_seed_mesh(sdpa_sinks_case()));

}  // namespace meshtest::dist::fused_test
