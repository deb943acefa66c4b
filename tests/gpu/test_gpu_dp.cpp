// The DP-SGD kernels of a Linear layer on one GPU (src/gpu/dp.hpp) against naive per-sample
// loops in f64 (tests/support/dp_reference.hpp) and the CPU ops on the same inputs, under the
// error model (docs/tolerances.md), f32 and f64: the ghost and direct per-sample norms (2-D and
// 3-D inputs, T past one Gram chunk, B = 0, one sample), the direct method's fused weight
// gradient, the bias norms, the book-keeping clipped weight and bias sums; the bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/dp/bookkeeping.hpp"
#include "src/dp/norms.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/dp.hpp"
#include "tests/support/dp_norm_cases.hpp"
#include "tests/support/dp_reference.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::gpu {
namespace {

using test_support::expect_error;
using test_support::naive_sample_bias_grad;
using test_support::naive_sample_weight_grad;
using test_support::sum_sq;

using Case = test_support::NormCase;
using test_support::make;
using test_support::naive_norm_sq;
using test_support::name;
using test_support::norm_model;
using test_support::seq;

DeviceTensor on_gpu(const Tensor& t) { return DeviceTensor::from_host(t); }

void expect_model(const Tensor& want, const Tensor& got, const ErrorModel& m,
                  const std::string& label, const std::optional<Tensor>& scale = std::nullopt) {
  test_support::expect_within(want, got, m, label, scale);
}

const std::vector<Case> kCases = {{5, 0, 7, 3},
                                  {4, 9, 7, 5},
                                  {3, 300, 3, 4},
                                  {2, 3, 300, 270},
                                  {1, 1, 4, 4},
                                  {0, 4, 3, 2},
                                  {4, 9, 7, 5, DType::f32},
                                  {6, 0, 5, 8, DType::f32},
                                  {2, 1100, 3, 2},
                                  {3, 64, 96, 80, DType::f32}};

TEST(GpuDpNorms, GhostAndDirectMatchTheLoopsAndTheCpuOps) {
  Blas blas;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    const Tensor a = make(c, c.din, 1), g = make(c, c.dout, 2);
    const DeviceTensor da = on_gpu(a), dg = on_gpu(g);
    const Tensor want = naive_norm_sq(a, g);
    const Tensor ghost = dp::ghost_norm_sq(blas, da, dg).to_host();
    const Tensor direct = dp::direct_norm_sq(blas, da, dg).to_host();
    EXPECT_EQ(ghost.shape(), (Shape{c.batch}));
    expect_model(want, ghost, norm_model(c), "ghost vs loops");
    expect_model(want, direct, norm_model(c), "direct vs loops");
    // Against the CPU ops: both in the inputs' dtype, in other orders.
    ErrorModel both = norm_model(c);
    both.reference = Reference::other_order;
    expect_model(meshtest::dp::ghost_norm_sq(a, g), ghost, both, "ghost vs CPU");
    expect_model(meshtest::dp::direct_norm_sq(a, g), direct, both, "direct vs CPU");
  }
}

TEST(GpuDpNorms, DirectFusedWithTheWeightGradAndBiasNorms) {
  Blas blas;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    const Tensor a = make(c, c.din, 3), g = make(c, c.dout, 4);
    Tensor start = random_normal({c.dout, c.din}, c.dtype, {.seed = 5});
    DeviceTensor wg = on_gpu(start);
    const Tensor sq = dp::direct_norm_sq(blas, on_gpu(a), on_gpu(g), &wg).to_host();
    // start + Σ_i G_iᵀA_i: B·T products (and the start) per element, each its own magnitude.
    Tensor want = start.astype(DType::f64), mag = magnitude(start).astype(DType::f64);
    for (std::int64_t i = 0; i < c.batch; ++i) {
      want.vector<double>() += naive_sample_weight_grad(a, g, i).vector<double>();
      mag.vector<double>() +=
          naive_sample_weight_grad(magnitude(a), magnitude(g), i).vector<double>();
    }
    const ErrorModel wm{
        .dtype = c.dtype, .terms = c.batch * seq(c) + 1, .reference = norm_model(c).reference};
    expect_model(want, wg.to_host(), wm, "weight grad", mag);
    expect_model(naive_norm_sq(a, g), sq, norm_model(c), "norms with the weight grad");
    // ‖Σ_t g_it‖²: T terms per element, then d_out squares.
    std::vector<double> bias;
    for (std::int64_t i = 0; i < c.batch; ++i) bias.push_back(sum_sq(naive_sample_bias_grad(g, i)));
    expect_model(test_support::as_tensor(bias), dp::bias_norm_sq(blas, on_gpu(g)).to_host(),
                 {.dtype = c.dtype, .terms = seq(c) + c.dout, .reference = norm_model(c).reference},
                 "bias norms");
  }
}

TEST(GpuDpBookkeeping, ClippedSumsMatchTheLoopsAndTheCpuOps) {
  Blas blas;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    const Tensor a = make(c, c.din, 6), g = make(c, c.dout, 7);
    const Tensor coef = random_uniform({c.batch}, c.dtype, {.seed = 8}, 0.05, 1.0);
    Tensor want(Shape{c.dout, c.din}, DType::f64), mag(Shape{c.dout, c.din}, DType::f64);
    Tensor bias(Shape{c.dout}, DType::f64), bias_mag(Shape{c.dout}, DType::f64);
    for (std::int64_t i = 0; i < c.batch; ++i) {
      want.vector<double>() += coef.item(i) * naive_sample_weight_grad(a, g, i).vector<double>();
      mag.vector<double>() +=
          coef.item(i) * naive_sample_weight_grad(magnitude(a), magnitude(g), i).vector<double>();
      bias.vector<double>() += coef.item(i) * naive_sample_bias_grad(g, i).vector<double>();
      bias_mag.vector<double>() +=
          coef.item(i) * naive_sample_bias_grad(magnitude(g), i).vector<double>();
    }
    // B·T products per element (the coefficient's product exact in the loops' f64 for f32).
    const ErrorModel m{.dtype = c.dtype,
                       .terms = std::max<std::int64_t>(c.batch * seq(c), 1) + 1,
                       .reference = norm_model(c).reference};
    const DeviceTensor da = on_gpu(a), dg = on_gpu(g), dc = on_gpu(coef);
    const Tensor w = dp::clipped_weight_grad(blas, da, dg, dc).to_host();
    expect_model(want, w, m, "clipped weight grad", mag);
    expect_model(bias, dp::clipped_bias_grad(blas, dg, dc).to_host(), m, "clipped bias grad",
                 bias_mag);
    {  // Queued only (the GPU model's calls): the same bits once the stream has run them.
      const DeviceTensor queued = dp::clipped_weight_grad(blas, da, dg, dc, dp::Finish::queued);
      blas.synchronize();
      EXPECT_TRUE(queued.to_host().bitwise_equal(w));
    }
    if (c.batch > 0) {
      ErrorModel both = m;
      both.reference = Reference::other_order;
      expect_model(meshtest::dp::clipped_weight_grad(a, g, coef), w, both, "vs CPU", mag);
    }
  }
}

TEST(GpuDp, BadInputIsAnErrorNamingIt) {
  Blas blas;
  const DeviceTensor a = on_gpu(random_normal({5, 4, 6}, DType::f64, {.seed = 9}));
  const DeviceTensor g = on_gpu(random_normal({5, 4, 3}, DType::f64, {.seed = 10}));
  const DeviceTensor g_other_t = on_gpu(random_normal({5, 3, 3}, DType::f64, {.seed = 11}));
  expect_error([&] { (void)dp::ghost_norm_sq(blas, a, g_other_t); },
               {"gpu ghost_norm_sq: activations", "differ in B or T"});
  expect_error(
      [&] {
        (void)dp::direct_norm_sq(blas, a, on_gpu(Tensor({5, 4, 3}, DType::f32)));
      },
      {"gpu direct_norm_sq: activations are f64 but output grads are f32"});
  expect_error([&] { (void)dp::ghost_norm_sq(blas, on_gpu(Tensor({5}, DType::f64)), g); },
               {"gpu ghost_norm_sq: activations has shape [5], expected [B, d] or [B, T, d]"});
  expect_error(
      [&] {
        (void)dp::ghost_norm_sq(blas, on_gpu(Tensor({5, 4, 6}, DType::bf16)),
                                on_gpu(Tensor({5, 4, 3}, DType::bf16)));
      },
      {"gpu ghost_norm_sq: the activations are", "f32 or f64 expected"});
  DeviceTensor bad_wg(Shape{6, 3}, DType::f64);
  expect_error([&] { (void)dp::direct_norm_sq(blas, a, g, &bad_wg); },
               {"gpu direct_norm_sq: weight_grad is", "expected f64[3, 6]"});
  expect_error([&] { (void)dp::clipped_weight_grad(blas, a, g, on_gpu(Tensor({4}, DType::f64))); },
               {"gpu clipped_weight_grad: coef is", "expected f64[5]"});
  expect_error([&] { (void)dp::clipped_bias_grad(blas, g, on_gpu(Tensor({5}, DType::f32))); },
               {"gpu clipped_bias_grad: coef is", "expected f64[5]"});
}

}  // namespace
}  // namespace meshtest::gpu
