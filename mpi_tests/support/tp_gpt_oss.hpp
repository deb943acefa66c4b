// Shared pieces of the gpt-oss tensor-parallel MPI tests: the TP test config, inputs, and a
// "TP against single device" check by PCC and max abs error that logs both.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/tensor_parallel.hpp"
#include "dist/shard/placement.hpp"
#include "dist/testing/single_device.hpp"
#include "src/check/compare.hpp"
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

/// Bound on max |got - expected| relative to scale = max(1, max |expected|): PCC cannot see a
/// uniform scale error (an all_reduce that averages, a bias added twice on a constant input),
/// this bound does.
///   f32:  1e-5. TP and single device differ only in the order of f32 sums (dot products of
///         <= 64 terms, all_reduce of <= 16 partials, softmax over <= 11 keys): ~1e-7 relative
///         each, ~1e-6 after 2 layers; a 1e-5 scale error already fails.
///   bf16: 0.05. The sharded and reference paths round partial results to bf16 (unit
///         roundoff 2^-8 = 0.4%) at different places; a few roundings in a row stay well under
///         5%, an averaged all_reduce (>= 50% off at TP >= 2) does not.
inline double max_abs_tolerance(DType dtype) { return dtype == DType::bf16 ? 0.05 : 1e-5; }

/// Collective over the mesh. Runs `sharded` on every device's shards of `inputs`, gathers its
/// result (placed `output`) and compares it on device 0 with `reference(full inputs)` twice:
/// PCC >= threshold(dtype) and max abs error <= max_abs_tolerance(dtype) * max(1, max
/// |expected|). Records a gtest failure for each failed check and prints
/// "PCC <label> mesh <RxC> <pcc> max_abs <error> <= <bound> ok|FAIL" on device 0.
inline void expect_tp_matches_full(const MeshDevice& mesh,
                                   const std::vector<testing::ShardedInput>& inputs,
                                   const testing::ReferenceFn& reference,
                                   const std::function<Tensor(const std::vector<Tensor>&)>& sharded,
                                   const Placements& output, DType dtype,
                                   const std::string& label) {
  Tensor expected;  // set on device 0 only
  Tensor local;
  const Comparison pcc = testing::expect_matches_single_device(
      mesh, inputs,
      [&](const std::vector<Tensor>& full) {
        expected = reference(full);
        return expected;
      },
      [&](const MeshDevice&, const std::vector<Tensor>& shards) {
        local = sharded(shards);
        return local;
      },
      output, {.metric = Metric::pcc, .threshold = threshold(dtype), .label = label});
  const Tensor got = gather_full(local, mesh, output);
  if (mesh.device_id() != 0) return;
  const double scale =
      std::max(1.0, expected.numel() == 0 ? 0.0 : to_f64(expected).abs().maxCoeff());
  const double bound = max_abs_tolerance(dtype) * scale;
  const Comparison err = compare(expected, got, Metric::max_abs, bound);
  if (!err.passed) {
    ADD_FAILURE() << "sharded result differs from the single-device reference (" << label
                  << "): max abs error " << err.value << " > " << bound << " = "
                  << max_abs_tolerance(dtype) << " * scale " << scale << " on mesh " << mesh.str()
                  << "\n  " << err.str();
  }
  fmt::print("PCC {:<34} mesh {:<4} {:.9f} max_abs {:.3g} <= {:.3g} {}\n", label, mesh.str(),
             pcc.value, err.value, bound, pcc.passed && err.passed ? "ok" : "FAIL");
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
/// upcasts them): nmse <= max_nmse on device 0 (nmse 2e-4 is PCC ~0.9999). The bounds are about
/// twice the single-device figures of the reference model's bf16 policy; TP adds the rounding of
/// each device's partial sum (as the reference's own TP MLP does). Prints
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
/// (placed {Shard(0), Replicate}) and returns one placed the same way.
inline void expect_tp_matches(const MeshDevice& mesh, const Tensor& x,
                              const std::function<Tensor(const Tensor&)>& reference,
                              const std::function<Tensor(const Tensor&)>& sharded,
                              const std::string& label) {
  const Placements act = tp_activation_placements();
  expect_tp_matches_full(
      mesh, {{.full = x, .placements = act}},
      [&](const std::vector<Tensor>& full) { return reference(full[0]); },
      [&](const std::vector<Tensor>& local) { return sharded(local[0]); }, act, x.dtype(), label);
}

}  // namespace meshtest::dist::tp_test
