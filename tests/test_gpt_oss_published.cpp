// meshtest's gpt-oss against the published PyTorch model: fixtures under
// tests/fixtures/gpt_oss_published/seed<N>/ hold a tiny random checkpoint that meshtest wrote
// (bf16 weights, MXFP4 experts) and reference.safetensors, the published model's logits on it
// (tools/gpt_oss_reference.py: bf16 as published, and f32 with every parameter upcast), cut after
// 0, 1 and 2 blocks. On one device meshtest's bf16 logits must equal the published model's bit
// for bit (same bf16 roundings, f32 inside norms, RoPE and softmax), and its f32 logits lie within
// the error model of the whole chain (model_chain: f32 sums in another order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "src/check/gpt_oss_chains.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/safetensors.hpp"
#include "src/models/checkpoint.hpp"
#include "src/models/transformer.hpp"

namespace meshtest {
namespace test_gpt_oss_published {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(MESHTEST_SOURCE_DIR) / "tests/fixtures/gpt_oss_published";

std::vector<fs::path> fixtures() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(kFixtures)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::int64_t> tokens_of(const SafetensorsFile& ref) {
  const Tensor t = ref.read("tokens");
  return {t.span<std::int64_t>().begin(), t.span<std::int64_t>().end()};
}

TEST(GptOssPublished, FixturesArePresent) {
  // Three checkpoints, each with the published model's outputs for both dtypes and every cut.
  ASSERT_EQ(fixtures().size(), 3U) << kFixtures;
  for (const fs::path& dir : fixtures()) {
    const SafetensorsFile ref = SafetensorsFile::open(dir / "reference.safetensors");
    const GptOssConfig c = read_config(dir);
    for (const char* dtype : {"bf16", "f32"}) {
      for (std::int64_t n = 0; n <= c.num_hidden_layers; ++n) {
        EXPECT_TRUE(ref.contains(fmt::format("{}.logits.layers{}", dtype, n))) << dir;
      }
    }
    EXPECT_GT(c.sliding_window, 0);
    EXPECT_GT(static_cast<std::int64_t>(tokens_of(ref).size()), c.sliding_window)
        << "the tokens must reach past the sliding window of the even layers";
  }
}

TEST(GptOssPublished, Bf16LogitsAreThePublishedModelsBitForBit) {
  for (const fs::path& dir : fixtures()) {
    const SafetensorsFile ref = SafetensorsFile::open(dir / "reference.safetensors");
    const GptOssConfig c = read_config(dir);
    const std::vector<std::int64_t> tokens = tokens_of(ref);
    const TransformerWeights w = read_checkpoint(dir, c, DType::bf16);
    for (std::int64_t n = 0; n <= c.num_hidden_layers; ++n) {
      const std::string name = fmt::format("bf16.logits.layers{}", n);
      const Tensor got = transformer(tokens, w, c, {.num_layers = n}).astype(DType::f32);
      const Tensor want = ref.read(name);
      const Comparison exact = compare(want, got, Metric::exact, 0);
      EXPECT_TRUE(exact.passed) << dir.filename() << " " << name << ": " << exact.str();
    }
  }
}

TEST(GptOssPublished, F32LogitsLieWithinTheChainsErrorModel) {
  for (const fs::path& dir : fixtures()) {
    const SafetensorsFile ref = SafetensorsFile::open(dir / "reference.safetensors");
    const GptOssConfig c = read_config(dir);
    const std::vector<std::int64_t> tokens = tokens_of(ref);
    const TransformerWeights w = read_checkpoint(dir, c, DType::f32);
    for (std::int64_t n = 0; n <= c.num_hidden_layers; ++n) {
      const std::string name = fmt::format("f32.logits.layers{}", n);
      GptOssConfig cut = c;
      cut.num_hidden_layers = n;
      const ErrorModel model =
          model_chain(cut, static_cast<std::int64_t>(tokens.size())).model(DType::f32);
      const Tensor got = transformer(tokens, w, c, {.num_layers = n});
      const Comparison within = compare(ref.read(name), got, model);
      EXPECT_TRUE(within.passed) << dir.filename() << " " << name << " (" << model.str()
                                 << "): " << within.str();
      RecordProperty(dir.filename().string() + "." + name, fmt::format("{:.3g}", within.value));
    }
  }
}

}  // namespace test_gpt_oss_published
}  // namespace meshtest
