// The qkv_rope case of the fused-op kit, shared by its CPU test (test_fused_qkv_rope.cpp) and
// its GPU test (gpu/test_gpu_fused_qkv_rope.cpp): the inputs and their TP placements (each
// device's q, k and v heads: no CCL), the module's reference (linear, split_qkv, rope) and the
// error model; each test gives its own fused function.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/testing/fused/fused_op.hpp"
#include "mpi_tests/support/fused_gpt_oss.hpp"
#include "src/ops/attention.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/rope.hpp"

namespace meshtest::dist::fused_test {

/// Inputs x [T, hidden] (replicated), qkv.weight [(H + 2 KV) d, hidden] and qkv.bias (each
/// device: the rows of its heads); outputs q [T, KV, H/KV, d], k, v [T, KV, d] (Shard(1)).
inline testing::FusedInputs qkv_rope_inputs(const FusedSetup& s) {
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
inline std::vector<Tensor> qkv_rope_reference(const FusedSetup& s, const std::vector<Tensor>& in) {
  const GptOssConfig c = config(s);
  const auto [heads, kv_heads] = qkv_heads(c, in[1].shape()[0]);
  const Qkv qkv = split_qkv(linear(in[0], in[1], in[2]), heads, kv_heads, c.head_dim);
  auto [q, k] = rope(qkv.q, qkv.k, c.rope_params(), first_position(s));
  return {q, k, qkv.v};
}

/// The fused op adds the linear's terms in other blocks than the reference's Linear (a TP
/// device's rows, the panels of qkv_rope), in kDtype with the reference's roundings. n: the
/// linear over hidden and its bias, then rope's two products; r: the linear's bf16 output (read
/// by rope) and rope's rounded products (read by its sum). One model for q, k and v (v stops
/// after the linear: a looser bound).
inline ErrorModel qkv_rope_model(const FusedSetup& s) {
  const GptOssConfig c = config(s);
  return {.dtype = kDtype,
          .terms = c.hidden_size + 1 + 2,
          .roundings = 2,
          .reference = Reference::other_order};
}

/// The case on the default mesh (1 x N, or MESHTEST_FUSED_MESH) with `fused` as the op.
inline testing::FusedOpCase qkv_rope_case(std::string name, testing::FusedFn fused) {
  return testing::FusedOpCase{
      .name = std::move(name),
      .expected_pcc = 0.9999,
      .model = qkv_rope_model,
      .checkpoint_tensors = {attn_name("qkv.weight"), attn_name("qkv.bias")},
      .make_inputs = qkv_rope_inputs,
      .reference = qkv_rope_reference,
      .fused = std::move(fused),
  };
}

}  // namespace meshtest::dist::fused_test
