// test_fused_module: the gpt-oss module with its fused ops.
//   Mesh/FusedModule.*            the TP attention and transformer blocks with the fused ops on
//       equal the unfused ones (fused off: the module's own op sequence) on every mesh shape;
//   FusedModuleReport.*           the module test: the TP transformer_block, fused on, at the
//       fused-op unit tests' config, dtype, layer and prefill 128 (fused_gpt_oss.hpp), one
//       iteration between signposts with the profiler on, every device's records gathered and
//       written as DIR/gpt_oss_block/1xN/prefill_128_random_cache_on/module/
//       ops_perf_gpt_oss_block.csv (DIR: MESHTEST_REPORT_DIR, see fused_op.hpp); and in decode:
//       the block over a KV cache (tp_decode.hpp) filled by a prefill of kDecodeContext tokens,
//       then one token at position kDecodeContext, written under decode_1_random_cache_on.
//       CTest then compares each unit test's ops_perf_<op>.csv with the report of its mode by
//       `meshtest-report compare` (fused_module_compare_<op>[_decode] in
//       mpi_tests/CMakeLists.txt);
//   FusedModuleCompare.*          the comparison itself: qkv_rope run on device 0's shard with
//       the module's shapes matches the module's report; with one more token, or another head
//       count, compare_configs fails naming the field.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "dist/parallel/tensor_parallel.hpp"
#include "dist/parallel/tp_decode.hpp"
#include "dist/perf/gather.hpp"
#include "dist/testing/fused/fused_op.hpp"
#include "dist/testing/harness/fixtures.hpp"
#include "dist/testing/harness/harness.hpp"
#include "mpi_tests/support/fused_gpt_oss.hpp"
#include "mpi_tests/support/tp_gpt_oss.hpp"
#include "src/check/compare.hpp"
#include "src/check/tolerance.hpp"
#include "src/models/transformer_block.hpp"
#include "src/ops/qkv_rope.hpp"
#include "src/perf/compare.hpp"
#include "src/perf/ops_csv.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dist {
namespace {

using fused_test::kDecodeContext;
using fused_test::kDtype;
using fused_test::kLayer;

// ---- fused on equals fused off --------------------------------------------------------------

class FusedModule : public testing::MeshShapeTest {};

/// Per device: the fused TP result against the unfused TP result on the same shard, which adds
/// the same terms in another order (and rounds bf16 in more places): within the error model
/// `m` with the tensor scale (zero-mean random weights and inputs), and in bf16 PCC >= 0.9999.
void expect_fused_equals_unfused(const Tensor& unfused, const Tensor& fused, const ErrorModel& m,
                                 const std::string& label) {
  const Comparison err = compare(unfused, fused, m);
  EXPECT_TRUE(err.passed) << label << ": " << err;
  if (fused.dtype() == DType::bf16 && unfused.numel() > 1) {
    const Comparison p = compare(unfused, fused, Metric::pcc, 0.9999);
    EXPECT_TRUE(p.passed) << label << ": " << p.str();
  }
}

TEST_P(FusedModule, TpAttentionBlockFusedEqualsUnfused) {
  const GptOssConfig c = tp_test::config();
  if (!tp_test::tp_divides(c, mesh())) GTEST_SKIP() << "TP size does not divide the heads";
  for (const std::int64_t layer : {0, 1}) {  // layer 0: sliding window; layer 1: full causal
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const BlockWeights full = init_block_weights(c, layer, dtype, RandomInit{3});
      const AttentionWeights shard =
          shard_attention_weights(weight_source(full, layer), c, layer, tp_rank(mesh()));
      AttentionParams p = c.attention_params(layer);
      const AttentionParams unfused_p = p;
      p.fused = true;
      const std::string label = fmt::format("fused attention L{} {}", layer, dtype_name(dtype));
      // Against the single-device unfused block (gathered, device 0) ...
      tp_test::expect_tp_matches(
          mesh(), tp_test::input(c, dtype),
          [&](const Tensor& x) { return attention_block(x, full.attn, unfused_p); },
          [&](const Tensor& x) { return tp_attention_block(mesh(), x, shard, p); }, label);
      // ... and against the unfused TP block on every device's own tokens.
      const Tensor x = testing::chunk_of(tp_test::input(c, dtype), tp_activation_placements(),
                                         {mesh().axis_size(0), mesh().axis_size(1)},
                                         {mesh().axis_index(0), mesh().axis_index(1)});
      const ErrorModel m = attention_chain(c, tp_test::kTokens, mesh().axis_size(1)).model(dtype);
      expect_fused_equals_unfused(tp_attention_block(mesh(), x, shard, unfused_p),
                                  tp_attention_block(mesh(), x, shard, p), m, label);
    }
  }
}

TEST_P(FusedModule, TpTransformerBlockFusedEqualsUnfused) {
  const GptOssConfig c = tp_test::config();
  if (!tp_test::tp_divides(c, mesh())) GTEST_SKIP() << "TP size does not divide the heads";
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const BlockWeights full = init_block_weights(c, 0, dtype, RandomInit{4});
    const BlockWeights shard = shard_block_weights(weight_source(full, 0), c, 0, tp_rank(mesh()));
    const std::string label = fmt::format("fused block {}", dtype_name(dtype));
    tp_test::expect_tp_matches(
        mesh(), tp_test::input(c, dtype),
        [&](const Tensor& x) { return transformer_block(x, full, c, 0); },
        [&](const Tensor& x) {
          return tp_transformer_block(mesh(), x, shard, c, 0, {}, std::nullopt, {.fused = true});
        },
        label);
    const Tensor x = testing::chunk_of(tp_test::input(c, dtype), tp_activation_placements(),
                                       {mesh().axis_size(0), mesh().axis_size(1)},
                                       {mesh().axis_index(0), mesh().axis_index(1)});
    const ErrorModel m = block_chain(c, tp_test::kTokens, mesh().axis_size(1)).model(dtype);
    expect_fused_equals_unfused(
        tp_transformer_block(mesh(), x, shard, c, 0),
        tp_transformer_block(mesh(), x, shard, c, 0, {}, std::nullopt, {.fused = true}), m, label);
  }
}

MESHTEST_INSTANTIATE_MESH_SHAPES(FusedModule);

// ---- the module test ------------------------------------------------------------------------

/// The unit tests' parameters the module runs at: prefill 128 or decode 1, random weights,
/// program cache on.
testing::FusedParams module_params(testing::FusedMode mode = testing::FusedMode::prefill) {
  if (mode == testing::FusedMode::decode) return {.mode = mode, .seqlen = 1};
  return {};
}

/// The fused-op unit tests' setup on their default mesh (1 x N, or MESHTEST_FUSED_MESH).
testing::FusedSetup module_setup(testing::FusedMode mode = testing::FusedMode::prefill) {
  return {.params = module_params(mode), .mesh = testing::fused_default_mesh()};
}

/// The default mesh of the fused-op unit tests as a mesh device.
MeshDevice default_mesh() {
  const testing::MeshShape s = testing::fused_default_mesh();
  return MeshDevice({s[0], s[1]});
}

/// Collective over `mesh` (1 x N): the TP transformer_block of layer kLayer, fused on, in
/// kDtype. Prefill: on x [128, hidden]. Decode: over a KV cache filled by the block on
/// kDecodeContext tokens, on one token at position kDecodeContext (this device's token share
/// of each, tp_activation_placements). One warm-up call, then one call between
/// signpost("start") and ("stop") with the profiler on (a decode call rewrites the token's
/// cache position). Every device's records, gathered on device 0 (empty elsewhere).
std::vector<perf::OpRecord> module_records(const MeshDevice& mesh,
                                           testing::FusedMode mode = testing::FusedMode::prefill) {
  const testing::FusedSetup s = module_setup(mode);
  const GptOssConfig c = fused_test::config(s);
  const BlockWeights full = init_block_weights(c, kLayer, kDtype, RandomInit{s.seed});
  const TpRank tp = tp_rank(mesh);
  const BlockWeights shard = shard_block_weights(weight_source(full, kLayer), c, kLayer, tp);
  const Tensor x = fused_test::activation(s, {fused_test::tokens(s), c.hidden_size}, 0);
  const BlockOptions fused{.fused = true};
  KvCache cache(fused_test::keys(s), c.num_key_value_heads / tp.size, c.head_dim, kDtype);
  std::function<Tensor()> block = [&] {
    return tp_transformer_block(mesh, x, shard, c, kLayer, {}, std::nullopt, fused);
  };
  if (mode == testing::FusedMode::decode) {
    const auto mine = [&](const Tensor& full_rows) {
      return testing::chunk_of(full_rows, tp_activation_placements(),
                               {mesh.axis_size(0), mesh.axis_size(1)},
                               {mesh.axis_index(0), mesh.axis_index(1)});
    };
    const Tensor context = fused_test::activation(s, {kDecodeContext, c.hidden_size}, 5);
    const std::vector<CacheSegment> prefill{{.cache = &cache, .first = 0, .rows = kDecodeContext}};
    (void)tp_transformer_block_cached(mesh, mine(context), shard, c, kLayer, prefill, {}, fused);
    block = [&, token = mine(x)] {
      const std::vector<CacheSegment> step{{.cache = &cache, .first = kDecodeContext, .rows = 1}};
      return tp_transformer_block_cached(mesh, token, shard, c, kLayer, step, {}, fused);
    };
  }
  block();  // warm-up: plans built, the measured call hits the program cache
  std::vector<perf::OpRecord> mine;
  {
    const perf::Session session;
    perf::signpost("start");
    block();
    perf::signpost("stop");
    mine = perf::records();
  }
  return gather_records(mesh, mine);
}

/// The module report's path (fused_report_dir of op "gpt_oss_block", kind "module").
std::filesystem::path module_report(testing::MeshShape mesh,
                                    testing::FusedMode mode = testing::FusedMode::prefill) {
  return testing::fused_report_dir("gpt_oss_block", mesh, module_params(mode), "module") /
         "ops_perf_gpt_oss_block.csv";
}

/// Writes the module's report of `mode` on device 0 and checks that each fused op is in it.
void write_module_report(testing::FusedMode mode) {
  const MeshDevice mesh = default_mesh();
  const std::vector<perf::OpRecord> all = module_records(mesh, mode);
  if (mesh.device_id() != 0) return;
  const std::filesystem::path path = module_report(mesh.shape(), mode);
  testing::write_fused_device_perf(
      all, "gpt_oss_block", path.parent_path(),
      fmt::format("module {} mesh {}",
                  mode == testing::FusedMode::decode ? "decode 1" : "prefill 128", mesh.str()));
  const perf::OpsReport report = perf::read_ops_csv(path);
  for (const char* op : {"qkv_rope", "sdpa_sinks", "experts"}) {
    EXPECT_TRUE(std::any_of(report.records.begin(), report.records.end(),
                            [&](const perf::OpRecord& r) { return r.op_code == op; }))
        << op << " is not in the fused module's report " << path;
  }
}

TEST(FusedModuleReport, WritesTheModuleReport) { write_module_report(testing::FusedMode::prefill); }

TEST(FusedModuleReport, WritesTheDecodeReport) { write_module_report(testing::FusedMode::decode); }

// ---- the comparison itself ------------------------------------------------------------------

/// qkv_rope alone on device 0's TP shard of a `tp`-device mesh, on `tokens` tokens, profiled
/// between signposts: the report a unit test with those shapes writes (device 0 only).
perf::OpsReport qkv_rope_report(std::int64_t tokens, int tp, const std::string& source) {
  const testing::FusedSetup s = module_setup();
  const GptOssConfig c = fused_test::config(s);
  const BlockWeights full{.attn = init_attention_weights(c, kLayer, kDtype, RandomInit{s.seed}),
                          .mlp = {}};
  const AttentionWeights w =
      shard_attention_weights(weight_source(full, kLayer), c, kLayer, {.size = tp, .index = 0});
  const Tensor x = fused_test::activation(s, {tokens, c.hidden_size}, 0);
  const perf::Session session;
  perf::signpost("start");
  qkv_rope(x, w.qkv_weight, w.qkv_bias,
           {.num_heads = c.num_attention_heads / tp,
            .num_kv_heads = c.num_key_value_heads / tp,
            .rope = c.rope_params()});
  perf::signpost("stop");
  return perf::parse_ops_csv(perf::ops_csv(perf::records()), source);
}

bool names(const perf::CompareResult& r, const std::string& needle) {
  return std::any_of(r.problems.begin(), r.problems.end(),
                     [&](const std::string& p) { return p.find(needle) != std::string::npos; });
}

TEST(FusedModuleCompare, ChangedShapeFailsTheComparison) {
  const MeshDevice mesh = default_mesh();
  const std::vector<perf::OpRecord> all = module_records(mesh);
  if (mesh.device_id() != 0) return;
  const perf::OpsReport module = perf::parse_ops_csv(perf::ops_csv(all), "module");
  const int tp = mesh.axis_size(1);  // the TP axis (1 x N, or the seed's 2x4 and 4x8)

  const perf::CompareResult same =
      perf::compare_configs(qkv_rope_report(128, tp, "qkv_rope 128 tokens"), module);
  EXPECT_TRUE(same.ok) << same.summary << "\n" << fmt::format("{}", same.problems);

  // One more token: x is [129, hidden] (W, Z, Y, X = 1, 1, 129, 64), and so are the outputs.
  const perf::CompareResult token =
      perf::compare_configs(qkv_rope_report(129, tp, "qkv_rope 129 tokens"), module);
  EXPECT_FALSE(token.ok) << token.summary;
  EXPECT_TRUE(names(token, "INPUT_0_Y: unit '129', module '128'"))
      << fmt::format("{}", token.problems);
  EXPECT_TRUE(names(token, "OUTPUT_0_"));

  // Another head count: the shard of a TP size other than the module's (the unit test on the
  // wrong mesh): the qkv weight has other rows, heads= in the attributes differs.
  const int other_tp = tp == 1 ? 2 : 1;
  const perf::CompareResult heads =
      perf::compare_configs(qkv_rope_report(128, other_tp, "qkv_rope other heads"), module);
  EXPECT_FALSE(heads.ok) << heads.summary;
  EXPECT_TRUE(names(heads, "INPUT_1_Y")) << fmt::format("{}", heads.problems);
  EXPECT_TRUE(names(heads, "ATTRIBUTES")) << fmt::format("{}", heads.problems);
  fmt::print("compare: same shapes: {}\n  one more token: {}\n  other heads: {}\n", same.summary,
             token.summary, heads.summary);
}

}  // namespace
}  // namespace meshtest::dist
