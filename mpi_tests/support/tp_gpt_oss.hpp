// Shared pieces of the gpt-oss tensor-parallel MPI tests: the TP test config, inputs, the error
// model of each block's chain, and a "TP against single device" check by PCC and the error model
// that logs both.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/tensor_parallel.hpp"
#include "dist/shard/placement.hpp"
#include "dist/testing/harness/single_device.hpp"
#include "src/check/compare.hpp"
#include "src/check/gpt_oss_chains.hpp"
#include "src/check/metrics.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dist::tp_test {

/// The tiny config with heads that split over 1, 2, 4 and 8 devices: 16 q / 8 kv heads of 8,
/// intermediate 32 (4 experts top-2, hidden 64, vocab 128, 2 layers, window 4). At other TP
/// sizes (3, 5, 6, 12, 16, ...) some count does not divide: the tests expect the clear error
/// there (tp_split_error).
inline GptOssConfig config() { return GptOssConfig::tiny_tp(); }

/// Tokens of the tests: 11 (uneven over 2 to 10 token shards, some empty over 12 or 16; longer
/// than the window).
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

/// The error tensor parallelism over `tp` devices gives for `c`, as expect_error needles
/// {"<count> = <n>", "over <tp> devices"}: the first of num_attention_heads and
/// num_key_value_heads (when `attention`), then intermediate_size (when `mlp`), that `tp` does
/// not divide, in the order the library checks them; {} when every checked count divides.
/// At TP 16, for one, the 16 q heads split and the 8 kv heads do not.
inline std::vector<std::string> tp_split_error(const GptOssConfig& c, int tp, bool attention = true,
                                               bool mlp = true) {
  std::vector<std::pair<const char*, std::int64_t>> counts;
  if (attention) {
    counts.emplace_back("num_attention_heads", c.num_attention_heads);
    counts.emplace_back("num_key_value_heads", c.num_key_value_heads);
  }
  if (mlp) counts.emplace_back("intermediate_size", c.intermediate_size);
  for (const auto& [name, n] : counts) {
    if (n % tp != 0) return {fmt::format("{} = {}", name, n), fmt::format("over {} devices", tp)};
  }
  return {};
}

/// Runs f() under a profiler session and returns how many CCL records it left with op code
/// `op` ("all_gather", "all_reduce", ...) on this device.
template <class F>
std::int64_t count_ccl(std::string_view op, F&& f) {
  const perf::Session session;
  f();
  const std::vector<perf::OpRecord> rs = perf::records();
  return std::count_if(rs.begin(), rs.end(), [&](const perf::OpRecord& r) {
    return r.op_type == perf::OpType::ccl && r.op_code == op;
  });
}

/// PCC threshold: 0.99999 for f32, 0.99 for bf16.
inline double threshold(DType dtype) { return dtype == DType::bf16 ? 0.99 : 0.99999; }

/// True when every value of `expected` lies within the model's error bound (at the tensor's scale
/// max |expected|) of every other: the reference is constant up to rounding (constant weights
/// make every logit equal), so it has no signal for PCC to correlate, and PCC would compare the
/// roundings of two summation orders, a verdict that changes with the machine.
inline bool flat_to_rounding(const Tensor& expected, const ErrorModel& model) {
  if (expected.numel() == 0) return true;
  const Eigen::ArrayXd e = to_f64(expected);
  if (!e.isFinite().all()) return false;
  const double scale = e.abs().maxCoeff();
  return e.maxCoeff() - e.minCoeff() <= error_bound(model, scale, scale);
}

/// Collective over the mesh. Runs `sharded` on every device's shards of `inputs`, gathers its
/// result (placed `output`) and compares it on device 0 with `reference(full inputs)` twice:
/// within the error `model` with the tensor's scale max |expected| (the harness's verdict, with
/// the worst element and its device), and PCC >= threshold(model.dtype) where the reference has
/// a signal (not flat_to_rounding). The tests' inputs are zero-mean random, their weights random
/// or constant. PCC cannot see a uniform scale error (an all_reduce that averages, a bias added
/// twice on a constant input); the model does. Records a gtest failure for each failed check and
/// prints "PCC <label> mesh <RxC> <pcc|flat> model <error / bound> <= 1 ok|FAIL" on device 0.
inline void expect_tp_matches_full(const MeshDevice& mesh,
                                   const std::vector<testing::ShardedInput>& inputs,
                                   const testing::ReferenceFn& reference,
                                   const std::function<Tensor(const std::vector<Tensor>&)>& sharded,
                                   const Placements& output, const ErrorModel& model,
                                   const std::string& label) {
  Tensor expected;  // set on device 0 only
  Tensor local;
  const Comparison err = testing::expect_matches_single_device(
      mesh, inputs,
      [&](const std::vector<Tensor>& full) {
        expected = reference(full);
        return expected;
      },
      [&](const MeshDevice&, const std::vector<Tensor>& shards) {
        local = sharded(shards);
        return local;
      },
      output, {.model = model, .label = label});
  const Tensor got = gather_full(local, mesh, output);
  if (mesh.device_id() != 0) return;
  const bool flat = flat_to_rounding(expected, model);
  const double r = flat ? 1.0 : pcc(expected, got);
  const bool pcc_ok = r >= threshold(model.dtype);
  if (!pcc_ok) {
    ADD_FAILURE() << "sharded result differs from the single-device reference (" << label
                  << ") on mesh " << mesh.str() << ": pcc " << r << " < " << threshold(model.dtype);
  }
  fmt::print("PCC {:<34} mesh {:<4} {} model {:.3g} <= 1 {}\n", label, mesh.str(),
             flat ? std::string("flat       ") : fmt::format("{:.9f}", r), err.value,
             pcc_ok && err.passed ? "ok" : "FAIL");
}

/// The bf16 copy of f32 weights as a checkpoint read in bf16 gives it: norm scales stay f32.
inline BlockWeights bf16_weights(const BlockWeights& w32) {
  BlockWeights w = astype(w32, DType::bf16);
  w.attn.norm_scale = w32.attn.norm_scale;
  w.mlp.norm_scale = w32.mlp.norm_scale;
  return w;
}
inline TransformerWeights bf16_weights(const TransformerWeights& w32) {
  TransformerWeights w = astype(w32, DType::bf16);
  w.norm_scale = w32.norm_scale;
  for (std::size_t n = 0; n < w.blocks.size(); ++n) w.blocks[n] = bf16_weights(w32.blocks[n]);
  return w;
}

/// Collective over the mesh. The sharded bf16 result against the single-device f32 reference
/// (the f32 path is the reference for bf16; `reference_f32` gets the full bf16 inputs and
/// upcasts them): nmse <= max_nmse on device 0 (nmse 2e-4 is PCC ~0.9999). Each bf16 rounding
/// adds a relative error of variance u²/3 (u = 2^-8: 5.1e-6), so a chain of r roundings (Chain)
/// gives nmse ~ r·u²/3 on what it computes; a block's residual x, equal on both sides, dilutes
/// that. The statistic depends on where the chain rounds, not on the f32 summation order (that
/// adds ~1e-13), so it is the same on every processor. The bounds are about twice the figures
/// measured on one device; TP adds the rounding of each device's partial sum (as the
/// reference's own TP MLP does). Prints
/// "BF16 <label> mesh <RxC> nmse <value> <= <bound> ok|FAIL" on device 0.
inline void expect_bf16_tracks_f32(const MeshDevice& mesh,
                                   const std::vector<testing::ShardedInput>& inputs,
                                   const testing::ReferenceFn& reference_f32,
                                   const std::function<Tensor(const std::vector<Tensor>&)>& sharded,
                                   const Placements& output, double max_nmse,
                                   const std::string& label) {
  const Comparison c = testing::expect_matches_single_device(
      mesh, inputs, reference_f32,
      [&](const MeshDevice&, const std::vector<Tensor>& shards) { return sharded(shards); }, output,
      {.metric = Metric::nmse, .threshold = max_nmse, .label = "bf16 vs f32 " + label});
  if (mesh.device_id() != 0) return;
  fmt::print("BF16 {:<34} mesh {:<4} nmse {:.3g} <= {:.3g} {}\n", label, mesh.str(), c.value,
             max_nmse, c.passed ? "ok" : "FAIL");
}

/// expect_tp_matches_full for one activation x [T, hidden]: `sharded` runs on its token shard
/// (placed {Shard(0), Replicate}) and returns one placed the same way; the model is `chain`'s in
/// x's dtype. Left out, the chain is a transformer block of config() with up to x's T keys on
/// this mesh's TP axis (the longest chain one block has: it bounds its attention and MLP blocks
/// too).
inline void expect_tp_matches(const MeshDevice& mesh, const Tensor& x,
                              const std::function<Tensor(const Tensor&)>& reference,
                              const std::function<Tensor(const Tensor&)>& sharded,
                              const std::string& label,
                              const std::optional<Chain>& chain = std::nullopt) {
  const Placements act = tp_activation_placements();
  const Chain ch = chain ? *chain : block_chain(config(), x.shape()[0], tp_rank(mesh).size);
  expect_tp_matches_full(
      mesh, {{.full = x, .placements = act}},
      [&](const std::vector<Tensor>& full) { return reference(full[0]); },
      [&](const std::vector<Tensor>& local) { return sharded(local[0]); }, act, ch.model(x.dtype()),
      label);
}

}  // namespace meshtest::dist::tp_test
