// The experts case of the fused-op kit, shared by its CPU test (test_fused_experts.cpp) and its
// GPU test (gpu/test_gpu_fused_experts.cpp): the MLP weights of the module's layer (seeded or the
// checkpoint's) and their TP shards, the module's reference (the MLP block's sequence after the
// norm: experts_reference) and the error model of the TP form; each test gives its own fused
// function (the op on the TP axis 1 of the kit's mesh).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "dist/testing/fused/fused_op.hpp"
#include "mpi_tests/support/fused_gpt_oss.hpp"
#include "src/check/gpt_oss_chains.hpp"
#include "src/ops/moe/experts.hpp"

namespace meshtest::dist::fused_test {

/// The MLP tensors of the op (relative checkpoint names, after "block.<kLayer>.mlp."), in the
/// order of the fused op's inputs after t.
inline const std::array<std::string, 6> kMlpTensors = {"gate.weight", "gate.bias",   "mlp1_weight",
                                                       "mlp1_bias",   "mlp2_weight", "mlp2_bias"};

/// Checkpoint name of MLP tensor `rel` ("mlp1_weight") of kLayer.
inline std::string mlp_name(const std::string& rel) {
  return fmt::format("block.{}.mlp.{}", kLayer, rel);
}

/// Layer kLayer's MLP weights in kDtype: seeded random (init_mlp_weights), or the checkpoint's
/// (every tensor of kMlpTensors; norm.scale stays random: the op does not read it).
inline MlpWeights mlp_weights(const FusedSetup& s, const GptOssConfig& c) {
  MlpWeights w = init_mlp_weights(c, kLayer, kDtype, RandomInit{s.seed});
  if (s.checkpoint == nullptr) return w;
  const WeightSource src = checkpoint_source(*s.checkpoint, kDtype);
  Tensor* fields[] = {&w.gate_weight, &w.gate_bias,   &w.mlp1_weight,
                      &w.mlp1_bias,   &w.mlp2_weight, &w.mlp2_bias};
  for (std::size_t i = 0; i < kMlpTensors.size(); ++i)
    *fields[i] = src.whole(mlp_name(kMlpTensors[i]));
  return w;
}

/// The TP shard of MLP tensor `field` that device `coord` holds with TP over axis 1, by
/// shard_mlp_weights (tp_shard.hpp): its units' rows of mlp1, columns of mlp2.
inline testing::ShardFn mlp_shard(std::shared_ptr<const MlpWeights> w, GptOssConfig c,
                                  Tensor MlpWeights::*field) {
  return [w = std::move(w), c, field](const Tensor&, testing::MeshShape shape,
                                      testing::MeshCoord coord) {
    const BlockWeights block{.attn = {}, .mlp = *w};
    const MlpWeights shard = shard_mlp_weights(weight_source(block, kLayer), c, kLayer,
                                               {.size = shape[1], .index = coord[1]});
    return shard.*field;
  };
}

/// Inputs t [T, hidden] (the normed activation, replicated), the router gate.weight [E, hidden]
/// and gate.bias [E] (replicated), mlp1_weight [E, 2I, hidden], mlp1_bias [E, 2I] and
/// mlp2_weight [E, hidden, I] (each device: its units) and mlp2_bias [E, hidden] (replicated);
/// output [T, hidden] (replicated: the all_reduce's sum).
inline testing::FusedInputs experts_inputs(const FusedSetup& s) {
  const GptOssConfig c = config(s);
  const auto w = std::make_shared<const MlpWeights>(mlp_weights(s, c));
  return {.inputs = {{.name = "t", .full = activation(s, {tokens(s), c.hidden_size}, 0)},
                     {.name = "gate.weight", .full = w->gate_weight},
                     {.name = "gate.bias", .full = w->gate_bias},
                     {.name = "mlp1_weight",
                      .full = w->mlp1_weight,
                      .shard = mlp_shard(w, c, &MlpWeights::mlp1_weight)},
                     {.name = "mlp1_bias",
                      .full = w->mlp1_bias,
                      .shard = mlp_shard(w, c, &MlpWeights::mlp1_bias)},
                     {.name = "mlp2_weight",
                      .full = w->mlp2_weight,
                      .shard = mlp_shard(w, c, &MlpWeights::mlp2_weight)},
                     {.name = "mlp2_bias", .full = w->mlp2_bias}},
          .outputs = {kReplicated}};
}

/// The module's sequence (mlp_block after the norm): experts_reference.
inline std::vector<Tensor> experts_reference_seq(const FusedSetup& s,
                                                 const std::vector<Tensor>& in) {
  return {
      experts_reference(in[0], in[1], in[2], in[3], in[4], in[5], in[6], config(s).moe_params())};
}

inline std::vector<std::string> experts_checkpoint_tensors() {
  std::vector<std::string> names;
  for (const std::string& rel : kMlpTensors) names.push_back(mlp_name(rel));
  return names;
}

/// The TP form adds every sum in other blocks than the single-device sequence and sums the
/// devices' partials with an all_reduce (experts_chain, rounding each partial in bf16).
inline ErrorModel experts_model(const FusedSetup& s) {
  return experts_chain(config(s), static_cast<int>(tp_size(s))).model(kDtype);
}

/// The case on the default mesh (1 x N, or MESHTEST_FUSED_MESH) with `fused` as the op.
inline testing::FusedOpCase experts_case(std::string name, testing::FusedFn fused) {
  return testing::FusedOpCase{
      .name = std::move(name),
      .expected_pcc = 0.999,
      .model = experts_model,
      .checkpoint_tensors = experts_checkpoint_tensors(),
      .make_inputs = experts_inputs,
      .reference = experts_reference_seq,
      .fused = std::move(fused),
  };
}

}  // namespace meshtest::dist::fused_test
