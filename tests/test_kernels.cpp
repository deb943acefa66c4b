// The kernel-version harness: every version of every family against its reference on the
// small configurations (the full suite is `meshtest-kernels test`), the fp8 matmul reference
// against plain f64 loops, the measures on crafted outputs, and bad names.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "src/check/tolerance.hpp"
#include "src/core/fp8.hpp"
#include "src/kernels/bench.hpp"
#include "src/kernels/family.hpp"
#include "src/kernels/fp8_matmul.hpp"
#include "src/ops/mxfp4.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::kernels {
namespace test_kernels {

/// Expects `r` [m, n] to equal y[i][j] = sum_k term(i, j, k) summed in f64 loops, within the
/// error model: the same f64 products (or FMAs) added in another order, k terms per element,
/// each element's magnitude sum_k |term|.
template <class Term>
void expect_equals_loops(const Tensor& r, const Config& c, Term term) {
  Tensor loops(r.shape(), DType::f64), mag(r.shape(), DType::f64);
  for (std::int64_t i = 0; i < c.m; ++i) {
    for (std::int64_t j = 0; j < c.n; ++j) {
      double s = 0, a = 0;
      for (std::int64_t k = 0; k < c.k; ++k) {
        const double t = term(i, j, k);
        s += t;
        a += std::fabs(t);
      }
      loops.data<double>()[i * c.n + j] = s;
      mag.data<double>()[i * c.n + j] = a;
    }
  }
  const Comparison cmp = compare(loops, r, ErrorModel{.dtype = DType::f64, .terms = c.k}, mag);
  EXPECT_TRUE(cmp.passed) << c.name << ": " << cmp;
}

TEST(Kernels, EveryVersionOfEveryFamilyPassesTheSmallConfigurations) {
  for (const Family& f : families()) {
    const std::vector<Check> checks = check_family(f, f.quick_configs);
    EXPECT_EQ(checks.size(), f.versions.size() * f.quick_configs.size());
    EXPECT_TRUE(all_pass(checks)) << correctness_report(checks);
    for (const Check& c : checks) {
      EXPECT_GT(c.pcc, 0.999999) << c.family << " " << c.version << " " << c.config;
    }
  }
}

TEST(Kernels, Fp8MatmulReferenceEqualsPlainLoops) {
  // y[i][j] = sum_k (decode(xq) * xs)[i][k] * (decode(wq) * ws)[j][k], in f64 loops.
  const Family& f = family("fp8_matmul");
  for (const Config& c : f.quick_configs) {
    const Inputs in = f.make_inputs(c);
    const Tensor r = f.reference(in);
    const Fp8MatmulOperands o = fp8_matmul_operands(in);
    const auto value = [&](const BlockQuantized& q, std::int64_t row, std::int64_t col) {
      const std::int64_t cols = q.codes.shape()[1], nbc = q.scales.shape()[1];
      return static_cast<double>(
                 fp8_decode(q.codes.data<std::uint8_t>()[row * cols + col], Fp8Format::e4m3fn)) *
             q.scales.data<float>()[(row / q.block_rows) * nbc + col / q.block_cols];
    };
    expect_equals_loops(r, c, [&](std::int64_t i, std::int64_t j, std::int64_t k) {
      return value(o.x, i, k) * value(o.w, j, k);
    });
  }
}

TEST(Kernels, Mxfp4MatmulReferenceEqualsPlainLoops) {
  // y[i][j] = sum_k x[i][k] * e2m1(code of w[j][k]) * 2^(scale - 127), in f64 loops.
  const Family& f = family("mxfp4_matmul");
  for (const Config& c : f.quick_configs) {
    const Inputs in = f.make_inputs(c);
    const Tensor r = f.reference(in);
    const auto* x = in.tensors[0].data<float>();
    const auto* blocks = in.tensors[1].data<std::uint8_t>();
    const auto* scales = in.tensors[2].data<std::uint8_t>();
    const std::int64_t nb = c.k / 32;
    expect_equals_loops(r, c, [&](std::int64_t i, std::int64_t j, std::int64_t k) {
      const std::uint8_t byte = blocks[(j * nb + k / 32) * 16 + k % 32 / 2];
      const auto code = static_cast<std::uint8_t>(k % 2 == 0 ? byte & 0x0F : byte >> 4);
      return x[i * c.k + k] * e2m1_value(code) * std::ldexp(1.0, scales[j * nb + k / 32] - 127);
    });
  }
}

TEST(Kernels, MeasureFailsAVersionBeyondTheTolerance) {
  const Tensor r = Tensor::from_vector<double>(Shape({2, 2}), {4, -2, 1, 0});
  Tensor y = Tensor::from_vector<float>(Shape({2, 2}), {4, -2, 1, 0});
  Check c = measure(r, y, 1e-5);
  EXPECT_TRUE(c.pass);
  EXPECT_EQ(c.max_rel, 0);
  y.data<float>()[3] = 0.004f;  // 1e-3 of the largest |r|, where r is 0
  c = measure(r, y, 1e-5);
  EXPECT_FALSE(c.pass);
  // 0.004f is 0.004 to 2e-10 (an f32 rounding); the measures divide it by 4 and 16 in f64.
  EXPECT_NEAR(c.max_rel, 1e-3, 1e-9);
  EXPECT_NEAR(c.mean_rel, 0.25e-3, 1e-9);
  EXPECT_NEAR(c.max_abs, 0.004, 1e-9);
  y.data<float>()[3] = NAN;
  EXPECT_FALSE(measure(r, y, 1.0).pass);
  const std::string report = correctness_report(std::vector{c});
  EXPECT_NE(report.find("FAIL"), std::string::npos) << report;
  EXPECT_NE(report.find("1 of 1 checks FAILED"), std::string::npos) << report;
}

TEST(KernelBench, TheRecommendationRule) {
  EXPECT_EQ(recommendation("v1", "v3", 1.04),
            "prefer v1: v3 is only 4.0 % faster, not worth its complexity");
  EXPECT_EQ(recommendation("v1", "v3", 1.07), "weigh it: v3 is 7.0 % faster than the simpler v1");
  EXPECT_EQ(recommendation("v1", "v2", 1.5), "take v2: 50.0 % faster than the simpler v1");
  EXPECT_EQ(recommendation("v1", "v3", 0.95),
            "prefer v1: v3 wins the most configurations but is 5.0 % slower");
  EXPECT_EQ(recommendation("v1", "v1", 1.0), "take v1: the simplest version wins");
}

TEST(KernelBench, RunsAreSummarizedWithTheirMaxAndBestThroughput) {
  // Runs of 2, 4 and 6 ms at 6e9 flops: mean 4, best 2, max 6, std sqrt(8/3); 1.5 TFLOP/s at
  // the mean, 3 at the best.
  const std::vector<double> ms{4, 2, 6};
  const Timing t = summarize_runs("v1", ms, 6e9);
  EXPECT_DOUBLE_EQ(t.mean_ms, 4);
  EXPECT_DOUBLE_EQ(t.best_ms, 2);
  EXPECT_DOUBLE_EQ(t.max_ms, 6);
  EXPECT_NEAR(t.std_ms, std::sqrt(8.0 / 3.0), 1e-12);
  EXPECT_DOUBLE_EQ(t.tflops, 1.5);
  EXPECT_DOUBLE_EQ(t.best_tflops, 3);
  test_support::expect_error([] { (void)summarize_runs("v2", {}, 1); }, {"no timed run of v2"});
  const ConfigBench r{
      .config = family("fp8_matmul").quick_configs[0], .versions = {t}, .baseline = t};
  const std::string report = bench_report(family("fp8_matmul"), std::vector<ConfigBench>{r});
  EXPECT_NE(report.find("max ms"), std::string::npos) << report;
  EXPECT_NE(report.find("best TF/s"), std::string::npos) << report;
  EXPECT_NE(report.find("     6.000"), std::string::npos) << report;  // the max column
  EXPECT_NE(bench_json(family("fp8_matmul"), std::vector<ConfigBench>{r}).find("\"max_ms\":6.0"),
            std::string::npos);
  EXPECT_TRUE(cpu_device_line().starts_with("device: ")) << cpu_device_line();
}

TEST(KernelBench, TheFullSuiteHasTheSeedsShapes) {
  // The seed's benchmark adds 256- and 512-wide blocks, 4096^2 and a wide output.
  const Family& f = family("fp8_matmul");
  const auto has = [&](std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t b) {
    return std::ranges::any_of(f.configs, [&](const Config& c) {
      return c.m == m && c.n == n && c.k == k && c.block == b;
    });
  };
  EXPECT_TRUE(has(1024, 1024, 1024, 256));
  EXPECT_TRUE(has(4096, 4096, 4096, 512));
  EXPECT_TRUE(has(2048, 4096, 2048, 128));
}

TEST(KernelBench, TheReportMarksEachWinnerAndCountsWins) {
  const Family& f = family("fp8_matmul");
  const auto t = [](const char* v, double ms) {
    return Timing{.version = v, .mean_ms = ms, .best_ms = ms, .std_ms = 0, .tflops = 1 / ms};
  };
  const std::vector<ConfigBench> r = {{.config = f.quick_configs[0],
                                       .versions = {t("v1", 4), t("v2", 2), t("v3", 3)},
                                       .baseline = t("eigen f32", 1)},
                                      {.config = f.quick_configs[1],
                                       .versions = {t("v1", 5), t("v2", 1), t("v3", 6)},
                                       .baseline = t("eigen f32", 2)}};
  const std::string s = bench_report(f, r);
  EXPECT_NE(s.find("wins: v1 0 v2 2 v3 0"), std::string::npos) << s;
  EXPECT_NE(s.find("overall winner: v2 (2 of 2 configurations, 3.000 ms in all)"),
            std::string::npos)
      << s;
  // v1 / v2 time ratios 2 and 5: a geometric mean of sqrt(10).
  EXPECT_NE(s.find("v2 against v1: 3.162x (geometric mean of the time ratios)"), std::string::npos)
      << s;
  EXPECT_NE(s.find("recommendation: take v2: 216.2 % faster than the simpler v1"),
            std::string::npos)
      << s;
  // v2 on the first: 2 ms, the best (100 %), eigen 1 ms: 0.50 of it, marked.
  EXPECT_NE(s.find("100.0%      0.50  *"), std::string::npos) << s;
  EXPECT_EQ(std::ranges::count(s, '*'), 2) << s;
}

TEST(Kernels, UnknownNamesAreErrorsListingTheKnownOnes) {
  test_support::expect_error([] { family("fp4_conv"); },
                             {"no kernel family 'fp4_conv' (the families: fp8_matmul"});
  test_support::expect_error([] { version(family("fp8_matmul"), "v9"); },
                             {"fp8_matmul has no version 'v9' (its versions: v1, v2, v3)"});
  Inputs in;
  in.config = {"bad", 4, 4, 16, 16, 1e-5};
  test_support::expect_error([&] { fp8_matmul_v1(in); }, {"4 operands (xq, xs, wq, ws)"});
}

}  // namespace test_kernels
}  // namespace meshtest::kernels
