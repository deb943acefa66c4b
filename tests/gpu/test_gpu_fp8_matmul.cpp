// fp8_matmul_gpu: every GPU version against the f64 reference on the quick configurations and on
// operands whose block scales differ by powers of two (a scale read from the wrong block is then
// an error of the output's size, far past any tolerance), and the bad inputs' errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "src/core/error.hpp"
#include "src/core/random.hpp"
#include "src/gpu/kernels/family.hpp"
#include "src/gpu/kernels/fp8_matmul.hpp"
#include "src/gpu/runtime.hpp"
#include "src/kernels/fp8_matmul.hpp"
#include "src/ops/block_quant.hpp"

namespace meshtest::gpu {
namespace {

using kernels::Config;
using kernels::Inputs;

const GpuFamily& family() {
  static const GpuFamily f = fp8_matmul_gpu_family();
  return f;
}

const GpuVersion& version(const std::string& name) {
  for (const GpuVersion& v : family().versions) {
    if (v.name == name) return v;
  }
  fail("fp8_matmul_gpu has no version {}", name);
}

/// Fails with the check's parameters unless every version that ran passed.
void expect_all_pass(const std::vector<GpuCheck>& checks) {
  for (const GpuCheck& g : checks) {
    if (!g.skipped.empty()) continue;
    EXPECT_TRUE(g.error.empty()) << g.check.version << " on " << g.check.config << ": " << g.error;
    EXPECT_TRUE(g.check.pass) << g.check.version << " on " << g.check.config << ": max rel "
                              << g.check.max_rel << " > tolerance " << g.check.tolerance << ", PCC "
                              << g.check.pcc;
  }
}

TEST(GpuFp8Matmul, EveryVersionMatchesTheReferenceOnTheQuickConfigurations) {
  const auto checks = check_gpu_family(family(), family().quick_configs());
  std::printf("%s", gpu_correctness_report(checks).c_str());
  expect_all_pass(checks);
  // v1 and v2 run every quick configuration.
  for (const GpuCheck& g : checks) {
    if (g.check.version != "gpu v3") {
      EXPECT_TRUE(g.skipped.empty()) << g.skipped;
    }
  }
}

TEST(GpuFp8Matmul, EveryVersionMatchesTheReferenceOnShapesCuBlasLtTakes) {
  // v3 needs b = 128, k % 128, n % 16, m % 8: these run it (on sm_90), the odd m tile edges of
  // v2 included.
  const std::vector<Config> configs = {kernels::fp8_matmul_config("lt small", 8, 128, 128, 128),
                                       kernels::fp8_matmul_config("lt ragged", 136, 272, 384, 128),
                                       kernels::fp8_matmul_config("lt k 640", 64, 144, 640, 128)};
  const auto checks = check_gpu_family(family(), configs);
  std::printf("%s", gpu_correctness_report(checks).c_str());
  expect_all_pass(checks);
}

/// Inputs whose x groups and w blocks have magnitudes 2^-3 .. 2^4 in a pattern over the blocks.
Inputs blocky_inputs(const Config& c) {
  Tensor x = random_normal(Shape({c.m, c.k}), DType::f32, {.seed = 7, .stream = 1});
  Tensor w = random_normal(Shape({c.n, c.k}), DType::f32, {.seed = 7, .stream = 2}, 0.0, 0.05);
  for (std::int64_t r = 0; r < c.m; ++r) {
    for (std::int64_t j = 0; j < c.k; ++j) {
      x.data<float>()[r * c.k + j] *=
          std::ldexp(1.0f, static_cast<int>((r * 5 + j / c.block * 3) % 8) - 3);
    }
  }
  for (std::int64_t r = 0; r < c.n; ++r) {
    for (std::int64_t j = 0; j < c.k; ++j) {
      w.data<float>()[r * c.k + j] *=
          std::ldexp(1.0f, static_cast<int>((r / c.block * 7 + j / c.block * 2) % 8) - 3);
    }
  }
  BlockQuantized xq = quantize_groups(x, c.block);
  BlockQuantized wq = quantize_blocks(w, c.block);
  return {.config = c,
          .tensors = {std::move(xq.codes), std::move(xq.scales), std::move(wq.codes),
                      std::move(wq.scales)}};
}

TEST(GpuFp8Matmul, ScalesComeFromTheirOwnBlocks) {
  const Stream stream;
  for (const Config& c : {kernels::fp8_matmul_config("blocky", 48, 384, 512, 128),
                          kernels::fp8_matmul_config("blocky 32", 40, 96, 160, 32)}) {
    const Inputs in = blocky_inputs(c);
    const Tensor reference = kernels::fp8_matmul_reference(in);
    for (const GpuVersion& v : family().versions) {
      const std::string why = v.unsupported(c);
      if (!why.empty()) {
        std::printf("%s %s: skipped: %s\n", v.name.c_str(), c.name.c_str(), why.c_str());
        continue;
      }
      const PreparedRun run = v.prepare(in);
      run.launch(stream.get());
      stream.synchronize();
      const double tolerance = v.tolerance ? v.tolerance(c) : c.tolerance;
      const kernels::Check check = kernels::measure(reference, run.output(), tolerance);
      std::printf("%s %s: max rel %.3e (tolerance %.1e) PCC %.9f\n", v.name.c_str(), c.name.c_str(),
                  check.max_rel, tolerance, check.pcc);
      EXPECT_TRUE(check.pass) << v.name << " " << c.name << ": max rel " << check.max_rel;
    }
  }
}

TEST(GpuFp8Matmul, RepeatedRunsGiveTheSameBits) {
  const Config c = kernels::fp8_matmul_config("repeat", 64, 256, 256, 128);
  const Inputs in = family().cpu->make_inputs(c);
  const Stream stream;
  for (const GpuVersion& v : family().versions) {
    if (!v.unsupported(c).empty()) continue;
    const PreparedRun run = v.prepare(in);
    run.launch(stream.get());
    stream.synchronize();
    const Tensor first = run.output();
    run.launch(stream.get());
    run.launch(stream.get());
    stream.synchronize();
    EXPECT_TRUE(first.bitwise_equal(run.output())) << v.name;
  }
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no Error; expected one saying: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(GpuFp8Matmul, BadInputsAreErrors) {
  // v3 takes whole K blocks of 128.
  const Config ragged_k = kernels::fp8_matmul_config("k 96", 16, 128, 96, 128);
  const Inputs in = family().cpu->make_inputs(ragged_k);
  expect_error([&] { (void)version("gpu v3").prepare(in); },
               "gpu v3 cannot run 'k 96' (m 16 n 128 k 96 block 128): k 96 is not a multiple of "
               "128");
  EXPECT_NE(version("gpu v3").unsupported(ragged_k).find("not a multiple of 128"),
            std::string::npos);
  const Config block_64 = kernels::fp8_matmul_config("block 64", 16, 128, 128, 64);
  expect_error([&] { (void)version("gpu v3").prepare(family().cpu->make_inputs(block_64)); },
               "block 64: cuBLASLt's fp8 block scaling takes b = 128");
  // Scales that do not match the codes, for every version.
  Inputs bad = family().cpu->make_inputs(kernels::fp8_matmul_config("bad", 16, 32, 48, 16));
  bad.tensors[1] = Tensor(Shape({16, 2}), DType::f32);
  for (const char* v : {"gpu v1", "gpu v2"}) {
    expect_error([&] { (void)version(v).prepare(bad); }, "do not match x [16, 48]");
  }
  Inputs three = bad;
  three.tensors.pop_back();
  expect_error([&] { (void)version("gpu v1").prepare(three); }, "4 operands (xq, xs, wq, ws)");
}

}  // namespace
}  // namespace meshtest::gpu
