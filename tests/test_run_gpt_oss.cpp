// meshtest-run gpt-oss end to end: a tiny checkpoint written by meshtest (MXFP4 experts), run
// under mpirun at np 1, 2 and 4 (1-D and 2x2 / 2x1 meshes), and expert parallel (--ep-axis) at
// np 2, 3, 4 and 8, and with the fused ops (--fused) at np 2, logits compared with the in-process
// single-device transformer on the same checkpoint; corrupted checkpoints and bad options give
// exit 2 with a message naming the tensor, field or token.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "src/check/gpt_oss_chains.hpp"
#include "src/check/metrics.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/npy.hpp"
#include "src/core/safetensors.hpp"
#include "src/models/checkpoint.hpp"
#include "src/models/transformer.hpp"
#include "tests/support/run_command.hpp"
#include "tests/support/safetensors_edit.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest {
namespace {

namespace fs = std::filesystem;
using test_support::edit_safetensors;
using test_support::find_tensor;
using test_support::NamedTensors;

const std::vector<std::int64_t> kTokens{3, 17, 127, 0, 64, 17, 5, 99, 42, 8, 1};
const std::string kTokensArg = "3,17,127,0,64,17,5,99,42,8,1";

/// Expects f32 logits within the error model of the single-device f32 run: the same
/// computation in another order, the logits' scale max |expected|.
void expect_f32_logits(const Tensor& expected, const Tensor& got, const GptOssConfig& c,
                       std::int64_t tokens, int devices, const std::string& label) {
  const ErrorModel m = model_chain(c, tokens, devices).model(DType::f32);
  const Comparison r = compare(expected, got, m);
  EXPECT_TRUE(r.passed) << label << ": " << r;
}

/// build/bin/meshtest-run, beside this test's build/tests/ directory.
fs::path run_binary() {
  return fs::canonical("/proc/self/exe").parent_path().parent_path() / "bin" / "meshtest-run";
}

struct Outcome {
  int rc = -1;
  std::string output;  ///< stdout and stderr
};

/// Runs `meshtest-run gpt-oss <args>` under mpirun -np `np`; np = 0 runs the binary directly (a
/// singleton MPI job of one rank: mpirun takes seconds to end a job that exits non-zero).
Outcome run_cli(int np, const std::string& args) {
  const std::string launcher =
      np == 0 ? "" : fmt::format("mpirun --oversubscribe --allow-run-as-root -np {} ", np);
  const test_support::CommandResult r = test_support::run_command(
      fmt::format("{}{} gpt-oss {}", launcher, run_binary().string(), args));
  return {.rc = r.status, .output = r.out};
}

class RunGptOss : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(run_binary())) << run_binary() << " is not built";
    // f32 tensors, MXFP4 expert weights (as the published checkpoints store them).
    write_checkpoint(ckpt(), cfg_, init_transformer_weights(cfg_, DType::f32, RandomInit{21}));
  }
  fs::path ckpt() const { return dir_.path() / "ckpt"; }
  fs::path out() const { return dir_.path() / "logits.npy"; }
  std::string args(const std::string& extra) const {
    return fmt::format("--checkpoint {} --out {} {}", ckpt().string(), out().string(), extra);
  }
  /// Runs the CLI and expects exit 2 and every part in its output.
  void expect_bad(int np, const std::string& a, const std::vector<std::string>& parts) {
    const Outcome o = run_cli(np, a);
    EXPECT_EQ(o.rc, 2) << a << "\n" << o.output;
    for (const std::string& part : parts) {
      EXPECT_NE(o.output.find(part), std::string::npos) << "want '" << part << "' in:\n"
                                                        << o.output;
    }
    EXPECT_EQ(o.output.find("MPI_ABORT"), std::string::npos) << o.output;
  }

  test_support::TempDir dir_{"meshtest_run_gpt_oss"};
  GptOssConfig cfg_ = GptOssConfig::tiny_tp();
};

TEST_F(RunGptOss, F32LogitsMatchSingleDeviceAtNp124) {
  const Tensor expected =
      transformer(kTokens, read_checkpoint(ckpt(), cfg_, DType::f32), cfg_).astype(DType::f32);
  struct Run {
    int np;
    std::string mesh;
  };
  for (const Run& r : {Run{1, ""}, Run{2, ""}, Run{2, "2x1"}, Run{4, ""}, Run{4, "2x2"}}) {
    const std::string mesh = r.mesh.empty() ? "" : "--mesh " + r.mesh;
    const Outcome o =
        run_cli(r.np, args(fmt::format("--tokens {} --dtype f32 {}", kTokensArg, mesh)));
    ASSERT_EQ(o.rc, 0) << o.output;
    const Tensor got = read_npy(out());
    ASSERT_EQ(got.shape(), (Shape{11, cfg_.vocab_size}));
    ASSERT_EQ(got.dtype(), DType::f32);
    const double diff = max_abs_error(expected, got);
    expect_f32_logits(expected, got, cfg_, 11, r.np, fmt::format("np {} {}", r.np, mesh));
    std::printf("LOGITS np %d mesh %-4s max abs diff vs single device %.3g\n", r.np,
                r.mesh.empty() ? "1xN" : r.mesh.c_str(), diff);
    fs::remove(out());
  }
}

TEST_F(RunGptOss, FusedF32LogitsMatchTheUnfusedSingleDevice) {
  // --fused: qkv_rope and sdpa_sinks in every block (TransformerOptions::fused), TP and EP;
  // the reference is the unfused single-device model.
  const Tensor expected =
      transformer(kTokens, read_checkpoint(ckpt(), cfg_, DType::f32), cfg_).astype(DType::f32);
  for (const std::string& extra :
       {std::string("--mesh 1x2"), std::string("--mesh 2x1 --ep-axis 0")}) {
    const Outcome o =
        run_cli(2, args(fmt::format("--tokens {} --dtype f32 --fused {}", kTokensArg, extra)));
    ASSERT_EQ(o.rc, 0) << o.output;
    EXPECT_NE(o.output.find("fused ops"), std::string::npos) << o.output;
    const Tensor got = read_npy(out());
    const double diff = max_abs_error(expected, got);
    expect_f32_logits(expected, got, cfg_, 11, 2, extra);
    std::printf("LOGITS --fused np 2 %s max abs diff vs unfused single device %.3g\n",
                extra.c_str(), diff);
    fs::remove(out());
  }
}

TEST_F(RunGptOss, ExpertParallelF32LogitsMatchSingleDevice) {
  // The 4 experts on the EP axis (contiguous; at EP 8 half the devices hold none), TP on the
  // other axis: the 2x4 layout of the issue with EP on axis 0, EP over all of 1xN, odd EP 3.
  const Tensor expected =
      transformer(kTokens, read_checkpoint(ckpt(), cfg_, DType::f32), cfg_).astype(DType::f32);
  struct Run {
    int np;
    std::string mesh;
    int ep_axis;
  };
  for (const Run& r : {Run{2, "1x2", 1}, Run{2, "2x1", 0}, Run{3, "1x3", 1}, Run{4, "2x2", 0},
                       Run{4, "2x2", 1}, Run{8, "2x4", 0}, Run{8, "1x8", 1}}) {
    const Outcome o =
        run_cli(r.np, args(fmt::format("--tokens {} --dtype f32 --mesh {} --ep-axis {}", kTokensArg,
                                       r.mesh, r.ep_axis)));
    ASSERT_EQ(o.rc, 0) << o.output;
    EXPECT_NE(o.output.find(fmt::format("experts on axis {}", r.ep_axis)), std::string::npos)
        << o.output;
    const Tensor got = read_npy(out());
    ASSERT_EQ(got.shape(), (Shape{11, cfg_.vocab_size}));
    const double diff = max_abs_error(expected, got);
    expect_f32_logits(expected, got, cfg_, 11, r.np,
                      fmt::format("np {} mesh {} ep_axis {}", r.np, r.mesh, r.ep_axis));
    std::printf("LOGITS np %d mesh %s ep_axis %d max abs diff vs single device %.3g\n", r.np,
                r.mesh.c_str(), r.ep_axis, diff);
    fs::remove(out());
  }
}

TEST_F(RunGptOss, LayersAndBf16) {
  // --layers 1: only block 0; bf16 rounds like the reference: PCC >= 0.99 against the bf16
  // single-device run, and within the error model of the same bf16 computation in another
  // order.
  GptOssConfig one = cfg_;
  const TransformerWeights w16 = read_checkpoint(ckpt(), cfg_, DType::bf16, {.num_layers = 1});
  one.num_hidden_layers = 1;
  const Tensor expected = transformer(kTokens, w16, one);
  constexpr int np = 2;
  const Outcome o = run_cli(np, args(fmt::format("--tokens {} --layers 1", kTokensArg)));
  ASSERT_EQ(o.rc, 0) << o.output;
  EXPECT_NE(o.output.find("dtype bf16, 1 of 2 layers"), std::string::npos) << o.output;
  const Tensor got = read_npy(out());
  EXPECT_GE(pcc(expected, got), 0.99);
  // The bf16 roundings a later op reads (docs/gpt-oss.md, "Precision"), TP 2's partials among
  // them.
  const ErrorModel m =
      model_chain(one, static_cast<std::int64_t>(kTokens.size()), np).model(DType::bf16);
  const Comparison c = compare(expected, got, m);
  EXPECT_TRUE(c.passed) << c;
}

TEST_F(RunGptOss, MakeTinyCheckpointThenRun) {
  const fs::path made = dir_.path() / "made";
  const Outcome m = run_cli(0, fmt::format("--make-tiny-checkpoint {}", made.string()));
  ASSERT_EQ(m.rc, 0) << m.output;
  EXPECT_EQ(read_config(made).num_attention_heads, 16);
  const Outcome o = run_cli(2, fmt::format("--checkpoint {} --out {} --tokens 5,6,7 --dtype f32",
                                           made.string(), out().string()));
  ASSERT_EQ(o.rc, 0) << o.output;
  const Tensor expected = transformer(std::vector<std::int64_t>{5, 6, 7},
                                      read_checkpoint(made, cfg_, DType::f32), cfg_);
  expect_f32_logits(expected, read_npy(out()), cfg_, 3, 2, "made");
}

TEST_F(RunGptOss, MakeTinyCheckpointTakesASeedAndADtype) {
  // --seed picks other random weights, --tiny-dtype bf16 stores them as bf16 (the values a bf16
  // model loads exactly); a bad dtype is a clear error.
  const fs::path a = dir_.path() / "a", b = dir_.path() / "b";
  ASSERT_EQ(
      run_cli(0, fmt::format("--make-tiny-checkpoint {} --seed 5 --tiny-dtype bf16", a.string()))
          .rc,
      0);
  ASSERT_EQ(run_cli(0, fmt::format("--make-tiny-checkpoint {} --seed 6", b.string())).rc, 0);
  const SafetensorsFile fa = SafetensorsFile::open(a / "model.safetensors");
  const SafetensorsFile fb = SafetensorsFile::open(b / "model.safetensors");
  EXPECT_EQ(fa.info("embedding.weight").dtype, DType::bf16);
  EXPECT_EQ(fb.info("embedding.weight").dtype, DType::f32);
  const Tensor ea = fa.read("embedding.weight").astype(DType::f32);
  EXPECT_FALSE(ea.bitwise_equal(fb.read("embedding.weight"))) << "--seed changed nothing";
  const Outcome bad = run_cli(
      0, fmt::format("--make-tiny-checkpoint {} --tiny-dtype f16", (dir_.path() / "c").string()));
  EXPECT_EQ(bad.rc, 2) << bad.output;
  EXPECT_NE(bad.output.find("--tiny-dtype is 'f16', expected bf16 or f32"), std::string::npos)
      << bad.output;
}

TEST_F(RunGptOss, CorruptCheckpointsAndBadOptionsExit2) {
  const std::string tok = "--tokens 1,2,3";
  expect_bad(0, args("--tokens 1,128"), {"token 128 at position 1", "[0, 128)"});
  expect_bad(0, args("--tokens ''"), {"T = 0"});
  expect_bad(0, args("--tokens 1,x"), {"('x') is not an integer"});
  expect_bad(0, args(tok + " --dtype f16"), {"--dtype is 'f16'"});
  expect_bad(0, args(tok + " --layers 3"), {"--layers is 3"});
  expect_bad(0, args(tok + " --ep-axis 2"), {"--ep-axis is 2, expected 0 or 1"});
  expect_bad(0, fmt::format("--out {} {}", out().string(), tok), {"--checkpoint is required"});

  const fs::path st = ckpt() / "model.safetensors";
  edit_safetensors(st, [](NamedTensors& all) {
    std::erase_if(all, [](const auto& nt) { return nt.first == "block.1.attn.out.bias"; });
  });
  expect_bad(0, args(tok), {"no tensor 'block.1.attn.out.bias'"});
  edit_safetensors(st, [](NamedTensors& all) {
    all.emplace_back("block.1.attn.out.bias", Tensor({64}, DType::f32));
    find_tensor(all, "block.0.attn.sinks") = Tensor({5}, DType::f32);
  });
  expect_bad(0, args(tok), {"'block.0.attn.sinks' has shape [5], expected [16]"});
  edit_safetensors(st, [](NamedTensors& all) {
    find_tensor(all, "block.0.attn.sinks") = Tensor({16}, DType::f32);
    find_tensor(all, "norm.scale") = Tensor({64}, DType::i32);
  });
  expect_bad(0, args(tok), {"'norm.scale'", "dtype i32"});
  edit_safetensors(st, [](NamedTensors& all) {
    find_tensor(all, "norm.scale") = Tensor({64}, DType::f32);
    find_tensor(all, "block.1.mlp.mlp2_weight.scales") = Tensor({4, 64, 2}, DType::u8);
  });
  expect_bad(0, args(tok), {"block.1.mlp.mlp2_weight", "scales"});

  // config.json without a field; a truncated safetensors file.
  nlohmann::json j = nlohmann::json::parse(std::ifstream(ckpt() / "config.json"));
  j.erase("head_dim");
  std::ofstream(ckpt() / "config.json") << j.dump();
  expect_bad(0, args(tok), {"field 'head_dim' is missing"});
  write_config(ckpt(), cfg_);
  fs::resize_file(st, fs::file_size(st) / 2);
  expect_bad(0, args(tok), {"model.safetensors"});
}

TEST_F(RunGptOss, BadInputExits2OnEveryRank) {
  // Every rank checks the same input and exits 2 (no MPI_Abort, no hang).
  const std::string tok = "--tokens 1,2,3";
  expect_bad(2, args(tok + " --mesh 2x2"), {"--mesh 2x2 has 4 devices but 2 ranks"});
  expect_bad(3, args(tok), {"num_attention_heads = 16", "over 3 devices"});
  expect_bad(3, args(tok + " --ep-axis 0"), {"num_attention_heads = 16", "over 3 devices"});
  // The output path is checked (by rank 0, the writer) before any work.
  const fs::path nodir = dir_.path() / "nodir" / "logits.npy";
  expect_bad(2, fmt::format("--checkpoint {} --out {} {}", ckpt().string(), nodir.string(), tok),
             {"cannot write", "nodir does not exist"});
  edit_safetensors(ckpt() / "model.safetensors", [](NamedTensors& all) {
    std::erase_if(all, [](const auto& nt) { return nt.first == "block.0.mlp.mlp1_weight.blocks"; });
  });
  expect_bad(2, args(tok), {"block.0.mlp.mlp1_weight"});
  expect_bad(2, args(tok + " --ep-axis 1"), {"block.0.mlp.mlp1_weight"});
}

}  // namespace
}  // namespace meshtest
