// Shared pieces of the gpt-oss tensor-parallel MPI tests: the TP test config, inputs, and a
// "TP against single device" check that logs its PCC.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/tensor_parallel.hpp"
#include "dist/testing/single_device.hpp"
#include "src/core/random.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"

namespace meshtest::dist::tp_test {

/// The tiny config with heads that split over 1, 2, 4 and 8 devices: 16 q / 8 kv heads of 8,
/// intermediate 32 (4 experts top-2, hidden 64, vocab 128, 2 layers, window 4). At TP = 3 the
/// head counts do not divide: the tests expect the clear error there.
inline GptOssConfig config() { return GptOssConfig::tiny_tp(); }

/// Tokens of the tests: 11 (uneven over 2, 3, 4 and 8 token shards; longer than the window).
inline constexpr std::int64_t kTokens = 11;

/// Seeded input activations [T, hidden] (every rank builds the same tensor).
inline Tensor input(const GptOssConfig& c, DType dtype, std::int64_t tokens = kTokens) {
  return random_normal(Shape{tokens, c.hidden_size}, dtype, {.seed = 7, .stream = 1000});
}

/// "const" / "rand" for a WeightInit.
inline std::string init_name(const WeightInit& init) {
  return std::holds_alternative<ConstantInit>(init) ? "const0.5" : "rand";
}

/// Whether the size of TP axis `axis` divides the heads and intermediate of `c`.
inline bool tp_divides(const GptOssConfig& c, const MeshDevice& mesh, int axis = 1) {
  const int tp = mesh.axis_size(axis);
  return c.num_attention_heads % tp == 0 && c.num_key_value_heads % tp == 0 &&
         c.intermediate_size % tp == 0;
}

/// PCC threshold: 0.99999 for f32, 0.99 for bf16.
inline double threshold(DType dtype) { return dtype == DType::bf16 ? 0.99 : 0.99999; }

/// Runs `sharded` on the token shard of x (placed {Shard(0), Replicate}), gathers its result and
/// compares it with `reference(x)` by PCC; prints "PCC <label> <mesh> <value>" on rank 0.
inline void expect_tp_matches(const MeshDevice& mesh, const Tensor& x,
                              const std::function<Tensor(const Tensor&)>& reference,
                              const std::function<Tensor(const Tensor&)>& sharded,
                              const std::string& label) {
  const Placements act = tp_activation_placements();
  const Comparison c = testing::expect_matches_single_device(
      mesh, {{.full = x, .placements = act}},
      [&](const std::vector<Tensor>& full) { return reference(full[0]); },
      [&](const MeshDevice&, const std::vector<Tensor>& local) { return sharded(local[0]); }, act,
      {.metric = Metric::pcc, .threshold = threshold(x.dtype()), .label = label});
  if (mesh.device_id() == 0) {
    fmt::print("PCC {:<34} mesh {:<4} {:.9f} {}\n", label, mesh.str(), c.value,
               c.passed ? "ok" : "FAIL");
  }
}

}  // namespace meshtest::dist::tp_test
