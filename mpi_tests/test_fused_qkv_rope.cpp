// test_fused_qkv_rope: the fused qkv_rope against the attention block's linear + split_qkv +
// rope, in its TP form (each device's q, k and v heads: no CCL), over the fused-op kit's grid
// (dist/testing/fused/fused_op.hpp), with the gpt-oss module's config, dtype and layer.
#include "dist/testing/fused/fused_op.hpp"
#include "mpi_tests/support/fused_gpt_oss.hpp"
#include "src/ops/attention.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/qkv_rope.hpp"

namespace meshtest::dist::fused_test {
namespace {

/// Inputs x [T, hidden] (replicated), qkv.weight [(H + 2 KV) d, hidden] and qkv.bias (each
/// device: the rows of its heads); outputs q [T, KV, H/KV, d], k, v [T, KV, d] (Shard(1)).
testing::FusedInputs qkv_rope_inputs(const FusedSetup& s) {
  const GptOssConfig c = config(s);
  const auto w =
      std::make_shared<const AttentionWeights>(attention_weights(s, c, {"qkv.weight", "qkv.bias"}));
  const Placements heads = placements_1d(Shard{1});
  return {.inputs = {{.name = "x", .full = activation(s, {tokens(s), c.hidden_size}, 0)},
                     {.name = "qkv.weight", .full = w->qkv_weight, .shard = qkv_shard(w, c, false)},
                     {.name = "qkv.bias", .full = w->qkv_bias, .shard = qkv_shard(w, c, true)}},
          .outputs = {heads, heads, heads}};
}

/// The module's sequence (attention_block): linear, split_qkv, rope.
std::vector<Tensor> qkv_rope_reference(const FusedSetup& s, const std::vector<Tensor>& in) {
  const GptOssConfig c = config(s);
  const auto [heads, kv_heads] = qkv_heads(c, in[1].shape()[0]);
  const Qkv qkv = split_qkv(linear(in[0], in[1], in[2]), heads, kv_heads, c.head_dim);
  auto [q, k] = rope(qkv.q, qkv.k, c.rope_params(), first_position(s));
  return {q, k, qkv.v};
}

std::vector<Tensor> qkv_rope_fused(const FusedSetup& s, const MeshDevice&,
                                   const std::vector<Tensor>& local) {
  const GptOssConfig c = config(s);
  const auto [heads, kv_heads] = qkv_heads(c, local[1].shape()[0]);
  Qkv qkv = qkv_rope(local[0], local[1], local[2],
                     {.num_heads = heads,
                      .num_kv_heads = kv_heads,
                      .rope = c.rope_params(),
                      .position_offset = first_position(s)});
  return testing::fused_outputs(std::move(qkv.q), std::move(qkv.k), std::move(qkv.v));
}

/// The fused op adds the linear's terms in other blocks than the reference's Linear (a TP
/// device's rows, the panels of qkv_rope), in kDtype with the reference's roundings. n: the
/// linear over hidden and its bias, then rope's two products; r: the linear's bf16 output (read
/// by rope) and rope's rounded products (read by its sum). One model for q, k and v (v stops
/// after the linear: a looser bound).
ErrorModel qkv_rope_model(const FusedSetup& s) {
  const GptOssConfig c = config(s);
  return {.dtype = kDtype,
          .terms = c.hidden_size + 1 + 2,
          .roundings = 2,
          .reference = Reference::other_order};
}

}  // namespace

/// The case on the default mesh (1 x N, or MESHTEST_FUSED_MESH).
static testing::FusedOpCase qkv_rope_case() {
  return testing::FusedOpCase{
      .name = "qkv_rope",
      .expected_pcc = 0.9999,
      .model = qkv_rope_model,
      .checkpoint_tensors = {attn_name("qkv.weight"), attn_name("qkv.bias")},
      .make_inputs = qkv_rope_inputs,
      .reference = qkv_rope_reference,
      .fused = qkv_rope_fused,
  };
}

MESHTEST_FUSED_OP_TESTS(qkv_rope, qkv_rope_case());
// The same case fixed on the seed's 4x8 mesh (on_seed_mesh).
MESHTEST_FUSED_OP_TESTS(qkv_rope_on_4x8, on_seed_mesh(qkv_rope_case()));

}  // namespace meshtest::dist::fused_test
