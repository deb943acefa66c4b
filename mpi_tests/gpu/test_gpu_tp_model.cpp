// The tensor-parallel gpt-oss model on GPU ranks (dist/gpu/parallel/tp_transformer.hpp) against
// the CPU single-device model on the same weights (transformer, transformer_step and
// transformer_decode with the fused ops, the GPU's), by the error model of the chain
// (model_chain) and PCC: the prefill on every mesh of the world (1 x N: TP over all; N x 1: the
// tokens split; 2 x 2 at 4), constant and random weights, f32 and bf16; a prefill then decode
// steps over per-device KV caches; a batch decode of three sequences at their own positions;
// the blocks alone; the expert-parallel model (ep_transformer: experts on either axis, TP on the
// other) prefill and steps; the published model's logits (tests/fixtures/gpt_oss_published) on
// the GPU; bad input, the same Error on every device. At a world of 3 the config has 12 heads over
// 6 kv heads and 48 units, so that TP over 3 divides them.
//
// The routing rule: the GPU's router sums in cuBLASLt's order, so a token whose k-th and
// (k+1)-th router logits lie within their error of each other may take another expert, and its
// logits move by O(1). The weights and tokens here were checked to hold no such near-tie (a flip
// fails the error model, naming the token's logits); the single-GPU experts tests state and test
// the rule itself (tests/gpu/test_gpu_moe.cpp, mpi_tests/gpu/test_gpu_expert_parallel.cpp).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "dist/gpu/parallel/tp_transformer.hpp"
#include "dist/testing/gpu/gpu_test.hpp"
#include "mpi_tests/gpu/gpu_terms.hpp"
#include "mpi_tests/support/tp_gpt_oss.hpp"
#include "src/core/safetensors.hpp"
#include "src/models/checkpoint.hpp"
#include "src/models/decode.hpp"
#include "src/models/transformer.hpp"

namespace meshtest::dist {
namespace {

namespace fs = std::filesystem;
namespace mg = meshtest::gpu;

const std::vector<std::int64_t> kTokens{3, 17, 127, 0, 64, 17, 5, 99, 42, 8, 1};

/// tiny_tp (16 q / 8 kv heads of 8, 32 units: TP over 1, 2 or 4), or at a world of 3 the same
/// with 12 q / 6 kv heads and 48 units.
GptOssConfig config() {
  GptOssConfig c = GptOssConfig::tiny_tp();
  if (testing::world_size() % 3 == 0) {
    c.num_attention_heads = 12;
    c.num_key_value_heads = 6;
    c.intermediate_size = 48;
  }
  return c;
}

/// The meshes of the world: 1 x N, N x 1 (N > 1), and 2 x 2 at 4.
std::vector<std::pair<int, int>> meshes() {
  const int n = testing::world_size();
  std::vector<std::pair<int, int>> out{{1, n}};
  if (n > 1) out.emplace_back(n, 1);
  if (n == 4) out.emplace_back(2, 2);
  return out;
}

/// A model's weights on one mesh: the full host weights, this device's host shard and its copy on
/// the GPU.
struct Model {
  TransformerWeights full;
  TpRank tp;
  GpuTpTransformerWeights gpu;
};

Model model_on(const MeshDevice& mesh, const GptOssConfig& c, DType dtype, const WeightInit& init) {
  Model m{.full = init_transformer_weights(c, dtype, init), .tp = tp_rank(mesh), .gpu = {}};
  m.gpu = to_gpu(shard_transformer_weights(weight_source(m.full, c), c, m.tp));
  return m;
}

/// The GPU's logits on this device against `want` (the whole [T, vocab] single-device logits,
/// computed on every device) within the chain's model over `keys` keys.
void expect_logits(const MeshDevice& mesh, const Tensor& want, const DeviceTensor& got,
                   const GptOssConfig& c, std::int64_t keys, int tp, const std::string& label) {
  tp_test::expect_tp_matches_full(
      mesh, {}, [&](const std::vector<Tensor>&) { return want; },
      [&](const std::vector<Tensor>&) { return got.to_host(); }, tp_logits_placements(),
      model_chain(c, keys, tp).model(want.dtype()), label);
}

TEST(GpuTpModel, PrefillMatchesTheCpuModelOnEveryMesh) {
  const GptOssConfig c = config();
  for (const auto& [rows, cols] : meshes()) {
    const MeshDevice& mesh = gpu::mesh_of(rows, cols);
    for (const WeightInit& init : {WeightInit{ConstantInit{0.5}}, WeightInit{RandomInit{3}}}) {
      for (const DType dtype : {DType::f32, DType::bf16}) {
        const Model m = model_on(mesh, c, dtype, init);
        mg::Blas blas;
        const DeviceTensor got = tp_transformer(mesh, blas, kTokens, m.gpu, c);
        const Tensor want = transformer(kTokens, m.full, c, {.fused = true});
        expect_logits(
            mesh, want, got, c, static_cast<std::int64_t>(kTokens.size()), m.tp.size,
            fmt::format("gpu prefill {} {}", tp_test::init_name(init), dtype_name(dtype)));
      }
    }
  }
}

TEST(GpuTpModel, BlocksMatchTheCpuBlocks) {
  // Layer 0 (the sliding window) and layer 1 (full attention), one activation on every mesh:
  // tp_transformer_block on this device's token shard against transformer_block.
  const GptOssConfig c = config();
  const Tensor x = tp_test::input(c, DType::bf16);
  for (const auto& [rows, cols] : meshes()) {
    const MeshDevice& mesh = gpu::mesh_of(rows, cols);
    const Model m = model_on(mesh, c, DType::bf16, RandomInit{8});
    mg::Blas blas;
    for (const std::int64_t layer : {0, 1}) {
      const std::vector<GpuCacheSegment> one{{.cache = nullptr, .first = 0, .rows = x.shape()[0]}};
      tp_test::expect_tp_matches(
          mesh, x,
          [&](const Tensor& full) {
            return transformer_block(full, m.full.blocks[static_cast<std::size_t>(layer)], c, layer,
                                     {.fused = true});
          },
          [&](const Tensor& local) {
            return tp_transformer_block(mesh, blas, DeviceTensor::from_host(local),
                                        m.gpu.blocks[static_cast<std::size_t>(layer)], c, layer,
                                        one)
                .to_host();
          },
          fmt::format("gpu block {} bf16", layer), block_chain(c, x.shape()[0], m.tp.size));
    }
  }
}

TEST(GpuTpModel, PrefillThenDecodeStepsAsTheCpuModel) {
  // Seven tokens of prefill, then four steps of one token each, on per-device caches (each step
  // past the sliding window of the even layers reads a window of the cache), and one step of
  // two tokens: each step's logits against transformer_step on a CPU cache.
  const GptOssConfig c = config();
  for (const auto& [rows, cols] : meshes()) {
    const MeshDevice& mesh = gpu::mesh_of(rows, cols);
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const Model m = model_on(mesh, c, dtype, RandomInit{5});
      mg::Blas blas;
      GpuModelKvCache cache(mesh, c, 16, dtype);
      ModelKvCache cpu(c, 16, dtype);
      const std::vector<std::vector<std::int64_t>> steps{
          {3, 17, 127, 0, 64, 17, 5}, {99}, {42}, {8}, {1}, {77, 12}};
      for (std::size_t i = 0; i < steps.size(); ++i) {
        const DeviceTensor got = tp_transformer_step(mesh, blas, steps[i], m.gpu, c, cache);
        const Tensor want = transformer_step(steps[i], m.full, c, cpu, {.fused = true});
        ASSERT_EQ(cache.length, cpu.length);
        expect_logits(mesh, want, got, c, cpu.length, m.tp.size,
                      fmt::format("gpu step {} {}", i, dtype_name(dtype)));
      }
    }
  }
}

TEST(GpuTpModel, BatchDecodeAsTheCpuModel) {
  // Three sequences prefilled to 5, 2 and 9 tokens, then one batch step appending a token to
  // each at its own position; the batch's logits against transformer_decode on CPU caches.
  const GptOssConfig c = config();
  for (const auto& [rows, cols] : meshes()) {
    const MeshDevice& mesh = gpu::mesh_of(rows, cols);
    const DType dtype = DType::bf16;
    const Model m = model_on(mesh, c, dtype, RandomInit{6});
    mg::Blas blas;
    const std::vector<std::vector<std::int64_t>> prompts{
        {3, 17, 127, 0, 64}, {99, 42}, {8, 1, 77, 12, 5, 6, 7, 100, 101}};
    std::vector<GpuModelKvCache> caches;
    std::vector<ModelKvCache> cpu;
    for (const std::vector<std::int64_t>& p : prompts) {
      caches.emplace_back(mesh, c, 16, dtype);
      cpu.emplace_back(c, 16, dtype);
      (void)tp_transformer_step(mesh, blas, p, m.gpu, c, caches.back());
      (void)transformer_step(p, m.full, c, cpu.back(), {.fused = true});
    }
    const std::vector<std::int64_t> next{11, 22, 33};
    const DeviceTensor got = tp_transformer_decode(mesh, blas, next, m.gpu, c, caches);
    const Tensor want = transformer_decode(next, m.full, c, cpu, {.fused = true});
    for (std::size_t i = 0; i < caches.size(); ++i) EXPECT_EQ(caches[i].length, cpu[i].length);
    expect_logits(mesh, want, got, c, 10, m.tp.size, "gpu batch decode bf16");
  }
}

TEST(GpuTpModel, ExpertParallelModelMatchesTheCpuModel) {
  // The experts placed on either axis (contiguous), their units and the heads split over the
  // other where it divides them: ep_transformer's prefill, then a prefill of seven tokens and a
  // decode step over caches, against the CPU single-device model.
  const GptOssConfig c = config();
  int ran = 0;
  for (const auto& [rows, cols] : meshes()) {
    const MeshDevice& mesh = gpu::mesh_of(rows, cols);
    for (const int ep_axis : {0, 1}) {
      if (!tp_test::tp_divides(c, mesh, 1 - ep_axis)) continue;
      const EpOptions o{.ep_axis = ep_axis};
      const TpRank ep = ep_rank(mesh, o), tp = ep_tp_rank(mesh, o);
      const ExpertPlacement placement =
          place_experts(ExpertAssignment::Contiguous, c.num_experts, ep.size);
      const TransformerWeights full = init_transformer_weights(c, DType::bf16, RandomInit{3});
      const GpuEpTransformerWeights w =
          to_gpu(shard_ep_transformer_weights(weight_source(full, c), c, placement, ep.index, tp));
      mg::Blas blas;
      const auto expect = [&](const Tensor& want, const DeviceTensor& got, std::int64_t keys,
                              const std::string& what) {
        tp_test::expect_tp_matches_full(
            mesh, {}, [&](const std::vector<Tensor>&) { return want; },
            [&](const std::vector<Tensor>&) { return got.to_host(); },
            tp_logits_placements({.tp_axis = 1 - ep_axis}),
            model_chain(c, keys, tp.size).model(DType::bf16),
            fmt::format("gpu ep model ep_axis {} {}", ep_axis, what));
      };
      expect(transformer(kTokens, full, c, {.fused = true}),
             ep_transformer(mesh, blas, kTokens, w, c, {}, o),
             static_cast<std::int64_t>(kTokens.size()), "prefill");
      GpuModelKvCache cache(mesh, c, 16, DType::bf16, {.tp_axis = 1 - ep_axis});
      ModelKvCache cpu(c, 16, DType::bf16);
      for (const std::vector<std::int64_t>& step :
           std::vector<std::vector<std::int64_t>>{{3, 17, 127, 0, 64, 17, 5}, {99}}) {
        const DeviceTensor got = ep_transformer_step(mesh, blas, step, w, c, cache, {}, o);
        const Tensor want = transformer_step(step, full, c, cpu, {.fused = true});
        expect(want, got, cpu.length, fmt::format("step to {}", cpu.length));
      }
      ++ran;
    }
  }
  if (ran == 0) GTEST_SKIP() << "no axis size divides the heads";
}

TEST(GpuTpModel, MatchesThePublishedModel) {
  // The published PyTorch model's logits (tests/fixtures/gpt_oss_published; the CPU tests:
  // test_gpt_oss_published, test_tp_model) against the GPU model read from the same checkpoints,
  // cut after 0 .. L blocks, f32 and bf16, within the error model of the chain.
  const fs::path root = fs::path(MESHTEST_SOURCE_DIR) / "tests/fixtures/gpt_oss_published";
  const MeshDevice& mesh = gpu::mesh_of(1, testing::world_size());
  for (const char* seed : {"seed0", "seed1", "seed2"}) {
    const fs::path dir = root / seed;
    const GptOssConfig c = read_config(dir);
    if (!tp_test::tp_divides(c, mesh)) GTEST_SKIP() << "TP size does not divide the heads";
    const SafetensorsFile ref = SafetensorsFile::open(dir / "reference.safetensors");
    const Tensor t = ref.read("tokens");
    const std::vector<std::int64_t> tokens(t.span<std::int64_t>().begin(),
                                           t.span<std::int64_t>().end());
    const TpRank tp = tp_rank(mesh);
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const GpuTpTransformerWeights w = to_gpu(read_tp_checkpoint(dir, c, dtype, tp));
      mg::Blas blas;
      for (std::int64_t n = 0; n <= c.num_hidden_layers; ++n) {
        const std::string name = fmt::format("{}.logits.layers{}", dtype_name(dtype), n);
        GptOssConfig cut = c;
        cut.num_hidden_layers = n;
        const DeviceTensor got = tp_transformer(mesh, blas, tokens, w, c, {.num_layers = n});
        expect_logits(mesh, ref.read(name).astype(dtype), got, cut,
                      static_cast<std::int64_t>(tokens.size()), tp.size,
                      fmt::format("gpu published {} {}", seed, name));
      }
    }
  }
}

TEST(GpuTpModel, BadInputIsTheSameErrorOnEveryDevice) {
  const GptOssConfig c = config();
  const MeshDevice& mesh = gpu::mesh_of(1, testing::world_size());
  const Model m = model_on(mesh, c, DType::f32, RandomInit{7});
  mg::Blas blas;
  const std::vector<std::int64_t> bad{3, 128, 5};
  MESHTEST_EXPECT_ERROR(
      (void)tp_transformer(mesh, blas, bad, m.gpu, c),
      "tp_transformer: token 128 at position 1 is outside the vocabulary [0, 128)");
  MESHTEST_EXPECT_ERROR((void)tp_transformer(mesh, blas, std::vector<std::int64_t>{}, m.gpu, c),
                        "tp_transformer: no tokens given (T = 0)");
  GpuModelKvCache cache(mesh, c, 4, DType::f32);
  MESHTEST_EXPECT_ERROR((void)tp_transformer_step(mesh, blas, kTokens, m.gpu, c, cache),
                        "tp_transformer_step: cache 0 holds 0 of 4 positions; 11 more do not fit");
  EXPECT_EQ(cache.length, 0) << "a refused step leaves the cache as it was";
  GpuModelKvCache bf16_cache(mesh, c, 16, DType::bf16);
  MESHTEST_EXPECT_ERROR((void)tp_transformer_step(mesh, blas, kTokens, m.gpu, c, bf16_cache),
                        "tp_transformer_step: cache 0 holds bf16, the weights are f32");
  std::vector<GpuModelKvCache> two;
  two.emplace_back(mesh, c, 16, DType::f32);
  MESHTEST_EXPECT_ERROR(
      (void)tp_transformer_decode(mesh, blas, std::vector<std::int64_t>{1, 2}, m.gpu, c, two),
      "tp_transformer_decode: 2 tokens for 1 caches");
}

}  // namespace
}  // namespace meshtest::dist
