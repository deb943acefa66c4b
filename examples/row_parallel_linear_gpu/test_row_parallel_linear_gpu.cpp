// test_row_parallel_linear_gpu: the project's kernel on one GPU and the row-parallel linear on a
// line of 1..N GPU ranks against the CPU reference: under meshtest's error model on random
// inputs, exact on integer ones and a closed form, the same bits on every device, and bad input.
// Every test skips, on every rank and with the reason, where some rank has no GPU of its own.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dist/gpu/ccl/ccl.hpp"
#include "dist/gpu/ccl/rank_gpu.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "dist/shard/placement.hpp"
#include "dist/testing/harness/harness.hpp"
#include "dist/testing/harness/single_device.hpp"
#include "row_parallel_linear_gpu.hpp"
#include "src/check/compare.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/error.hpp"
#include "src/core/random.hpp"
#include "src/core/shape.hpp"

namespace row_parallel_gpu {
namespace {

using meshtest::Comparison;
using meshtest::DType;
using meshtest::ErrorModel;
using meshtest::Metric;
using meshtest::Reference;
using meshtest::Shape;
using meshtest::Tensor;
using meshtest::dist::kReplicated;
using meshtest::dist::MeshDevice;
using meshtest::dist::placements_1d;
using meshtest::dist::Shard;
using meshtest::dist::testing::expect_matches_single_device;

// A line mesh over every rank, each bound to a GPU of its own. Where some rank has none (no GPU,
// no driver, more ranks than GPUs on a node) every test skips on every rank with the agreed
// reason; CMakeLists.txt's SKIP_REGULAR_EXPRESSION turns that into CTest's "Skipped".
class RowParallelLinearGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    static const std::string problem = meshtest::dist::gpu::gpu_binding_problem();  // collective
    if (!problem.empty()) GTEST_SKIP() << "GPU ranks unavailable: " << problem;
    meshtest::dist::gpu::bind_rank_to_gpu();
    mesh_.emplace(MeshDevice::line());
  }
  void TearDown() override {
    meshtest::dist::testing::test_body_done();  // before the mesh's communicators are freed
    mesh_.reset();
  }
  const MeshDevice& mesh() const { return *mesh_; }

 private:
  std::optional<MeshDevice> mesh_;
};

// The model of a result of `dtype` whose elements each add `terms` terms, against the f64
// reference (Reference::exact), with per-element scale sum |terms|: the reference on magnitudes.
Comparison compare_under_model(const Tensor& x, const Tensor& w, const Tensor& bias,
                               const Tensor& got, std::int64_t terms) {
  const ErrorModel model{.dtype = got.dtype(), .terms = terms, .reference = Reference::exact};
  const Tensor scale =
      reference_linear(meshtest::magnitude(x), meshtest::magnitude(w), meshtest::magnitude(bias));
  return meshtest::compare(reference_linear(x, w, bias), got, model, scale);
}

// The meshtest::Error message of fn(), or "" when fn() does not throw one.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const meshtest::Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS_TEXT(text, needle) \
  EXPECT_NE((text).find(needle), std::string::npos) << "\"" << (text) << "\" lacks: " << (needle)

TEST_F(RowParallelLinearGpu, KernelMatchesTheReferenceOnOneGpu) {
  // The kernel alone on each rank's GPU (no communication): sizes off the 16 x 16 tile, smaller
  // than one and empty, with and without the bias, under the error model with n = K + 1 terms.
  struct Case {
    std::int64_t m, n, k;
  };
  for (const DType dtype : {DType::f32, DType::f64}) {
    for (const Case c : {Case{1, 1, 1}, Case{16, 16, 16}, Case{33, 17, 45}, Case{5, 70, 300},
                         Case{0, 4, 3}, Case{4, 0, 3}, Case{4, 5, 0}}) {
      const std::string params = fmt::format("M={} N={} K={} {}", c.m, c.n, c.k, dtype);
      const Tensor x = meshtest::random_normal({c.m, c.k}, dtype, {.seed = 1});
      const Tensor w = meshtest::random_normal({c.n, c.k}, dtype, {.seed = 2});
      const Tensor b = meshtest::random_normal({c.n}, dtype, {.seed = 3});
      const DeviceTensor dx = DeviceTensor::from_host(x), dw = DeviceTensor::from_host(w);
      const Tensor with_bias = linear(dx, dw, DeviceTensor::from_host(b)).to_host();
      ASSERT_EQ(with_bias.shape(), (Shape{c.m, c.n})) << params;
      const Comparison cmp = compare_under_model(x, w, b, with_bias, c.k + 1);
      EXPECT_TRUE(cmp.passed) << params << " with bias: " << cmp;
      const Tensor no_bias = linear(dx, dw).to_host();
      const Comparison cmp0 = compare_under_model(x, w, Tensor(Shape{c.n}, dtype), no_bias, c.k);
      EXPECT_TRUE(cmp0.passed) << params << " without bias: " << cmp0;
    }
  }
}

TEST_F(RowParallelLinearGpu, ClosedFormIsExactOnEveryDevice) {
  // x = 1, W[n, k] = k + 1, b[n] = n  =>  y[m, n] = K (K + 1) / 2 + n, exact in f32 and f64.
  // Each device builds only its own slices of K (uneven: K = 4p + 3) and checks its own y.
  const int p = mesh().size(), i = mesh().axis_index(1);
  const std::int64_t m_size = 3, n_size = 5, k = 4 * p + 3;
  const meshtest::Range r = meshtest::split_range(k, p, i);
  Tensor x64(Shape{m_size, r.size}, DType::f64), w64(Shape{n_size, r.size}, DType::f64);
  Tensor bias64(Shape{n_size}, DType::f64), want64(Shape{m_size, n_size}, DType::f64);
  x64.fill(1.0);
  for (std::int64_t n = 0; n < n_size; ++n) {
    bias64.data<double>()[n] = static_cast<double>(n);
    for (std::int64_t j = 0; j < r.size; ++j) {
      w64.data<double>()[n * r.size + j] = static_cast<double>(r.start + j + 1);
    }
    for (std::int64_t m = 0; m < m_size; ++m) {
      want64.data<double>()[m * n_size + n] = static_cast<double>(k * (k + 1) / 2 + n);
    }
  }
  for (const DType dtype : {DType::f32, DType::f64}) {
    const Tensor x = x64.astype(dtype), w = w64.astype(dtype), bias = bias64.astype(dtype);
    const Tensor want = want64.astype(dtype);
    const Tensor y = row_parallel_linear(mesh(), DeviceTensor::from_host(x),
                                         DeviceTensor::from_host(w), DeviceTensor::from_host(bias))
                         .to_host();
    EXPECT_TRUE(y.bitwise_equal(want))
        << meshtest::dtype_name(dtype) << " K = " << k << " on device " << mesh().device_id()
        << ": " << meshtest::compare(want, y, Metric::max_abs, 0);
  }
}

TEST_F(RowParallelLinearGpu, ExactOnIntegerInputsWithUnevenAndEmptySlices) {
  // Small integers: every product and sum is exact in f32, in any order, so the GPU result
  // equals the reference bit for bit. meshtest's harness splits x and w along K (array_split:
  // K = 13 is uneven at np 2 and 4, K = 3 leaves a device empty at np 4, K = 0 leaves the bias),
  // runs the op on each device and compares the gathered y on device 0.
  for (const std::int64_t k : {13, 3, 0}) {
    const Tensor x = meshtest::random_integers({5, k}, DType::f32, {.seed = 11}, -4, 4);
    const Tensor w = meshtest::random_integers({7, k}, DType::f32, {.seed = 12}, -4, 4);
    const Tensor b = meshtest::random_integers({7}, DType::f32, {.seed = 13}, -8, 8);
    const Comparison c = expect_matches_single_device(
        mesh(),
        {{.full = x, .placements = placements_1d(Shard{1})},
         {.full = w, .placements = placements_1d(Shard{1})},
         {.full = b, .placements = kReplicated}},
        [](const std::vector<Tensor>& full) {
          return reference_linear(full[0], full[1], full[2]).astype(DType::f32);
        },
        [](const MeshDevice& m, const std::vector<Tensor>& local) {
          return row_parallel_linear(m, DeviceTensor::from_host(local[0]),
                                     DeviceTensor::from_host(local[1]),
                                     DeviceTensor::from_host(local[2]))
              .to_host();
        },
        kReplicated, {.metric = Metric::exact, .label = fmt::format("K={} f32 integers", k)});
    EXPECT_TRUE(c.passed) << "K = " << k;
  }
}

TEST_F(RowParallelLinearGpu, RandomInputsWithinTheErrorModel) {
  // Random normal x, w, b, split along K by meshtest's placements; each device's y against the
  // f64 reference under the error model, per element with its sum of |terms|. Terms per
  // element: K products, the bias and the p partials the all_reduce adds (n = K + 1 + p, an
  // upper bound: the kernel's steps are fused multiply-adds, rounding once each).
  const int p = mesh().size();
  for (const DType dtype : {DType::f32, DType::f64}) {
    for (const std::int64_t k : {97, 1000}) {
      const std::string params = fmt::format("M=33 N=40 K={} {} p={}", k, dtype, p);
      const Tensor x = meshtest::random_normal({33, k}, dtype, {.seed = 21});
      const Tensor w = meshtest::random_normal({40, k}, dtype, {.seed = 22});
      const Tensor b = meshtest::random_normal({40}, dtype, {.seed = 23});
      const auto sharded_k = placements_1d(Shard{1});
      const Tensor y =
          row_parallel_linear(
              mesh(), DeviceTensor::from_host(meshtest::dist::distribute(x, mesh(), sharded_k)),
              DeviceTensor::from_host(meshtest::dist::distribute(w, mesh(), sharded_k)),
              DeviceTensor::from_host(b))
              .to_host();
      const Comparison c = compare_under_model(x, w, b, y, k + 1 + p);
      EXPECT_TRUE(c.passed) << params << " on device " << mesh().device_id() << ": " << c;
      // The model is tight enough to see a wrong sum: the bias added twice fails it.
      Tensor twice = y.astype(DType::f64);
      for (std::int64_t e = 0; e < twice.numel(); ++e) twice.data<double>()[e] += b.item(e % 40);
      EXPECT_FALSE(compare_under_model(x, w, b, twice, k + 1 + p).passed) << params;
    }
  }
}

TEST_F(RowParallelLinearGpu, EveryDeviceGetsTheSameBits) {
  const int p = mesh().size();
  const std::int64_t k = 64 * p + 5;
  const auto sharded_k = placements_1d(Shard{1});
  const Tensor x = meshtest::random_normal({9, k}, DType::f32, {.seed = 31});
  const Tensor w = meshtest::random_normal({12, k}, DType::f32, {.seed = 32});
  const DeviceTensor y = row_parallel_linear(
      mesh(), DeviceTensor::from_host(meshtest::dist::distribute(x, mesh(), sharded_k)),
      DeviceTensor::from_host(meshtest::dist::distribute(w, mesh(), sharded_k)),
      DeviceTensor::from_host(meshtest::random_normal({12}, DType::f32, {.seed = 33})));
  const DeviceTensor y0 = meshtest::dist::broadcast(mesh(), y, {.root = 0});
  EXPECT_TRUE(y.bitwise_equal(y0)) << "device " << mesh().device_id() << " differs from device 0";
}

// ------------------------------------------------------------------------------- bad input

TEST_F(RowParallelLinearGpu, LocalOperandsThatDoNotFitThrowBeforeAnyCollective) {
  // Every device gets the same bad operands and throws before communicating: no hang.
  const auto dev = [](Shape s, DType t = DType::f32) { return DeviceTensor(s, t); };
  const DeviceTensor x = dev({2, 3}), w = dev({4, 3}), b = dev({4});
  EXPECT_HAS_TEXT(error_of([&] {
                    row_parallel_linear(mesh(), x, dev({4, 2}), b);
                  }),
                  "x f32[2, 3] on cuda:");
  EXPECT_HAS_TEXT(error_of([&] {
                    row_parallel_linear(mesh(), x, dev({4, 2}), b);
                  }),
                  "disagree on K (3 and 2 columns)");
  EXPECT_HAS_TEXT(error_of([&] { row_parallel_linear(mesh(), x, w, dev({5})); }),
                  "does not match N = 4");
  EXPECT_HAS_TEXT(error_of([&] { row_parallel_linear(mesh(), x, w, dev({4}, DType::f64)); }),
                  "dtypes differ (x f32, w f32, bias f64)");
  EXPECT_HAS_TEXT(error_of([&] {
                    row_parallel_linear(mesh(), dev({2, 3}, DType::bf16), dev({4, 3}, DType::bf16),
                                        dev({4}, DType::bf16));
                  }),
                  "dtype bf16 is not supported (f32 or f64)");
  EXPECT_HAS_TEXT(error_of([&] { linear(dev({6}), w); }), "must both be 2-D");
}

TEST_F(RowParallelLinearGpu, DevicesThatDisagreeOnNAllGetTheError) {
  if (mesh().size() < 2) GTEST_SKIP() << "needs 2 devices to disagree";
  // Device 1 has N = 5, the others N = 4: each is consistent locally, so meshtest's all_reduce
  // finds the disagreement and throws on every device; the mesh stays usable afterwards.
  const std::int64_t n_size = mesh().device_id() == 1 ? 5 : 4;
  const DeviceTensor x(Shape{2, 3}, DType::f32), w(Shape{n_size, 3}, DType::f32);
  const DeviceTensor b(Shape{n_size}, DType::f32);
  const std::string error = error_of([&] { row_parallel_linear(mesh(), x, w, b); });
  EXPECT_HAS_TEXT(error, "shapes disagree");
  Tensor one(Shape{1, 1}, DType::f32);
  one.fill(1.0);
  const DeviceTensor d_one = DeviceTensor::from_host(one);
  const Tensor y =
      row_parallel_linear(mesh(), d_one, d_one, DeviceTensor(Shape{1}, DType::f32)).to_host();
  EXPECT_EQ(y.item(0), mesh().size());
}

}  // namespace
}  // namespace row_parallel_gpu
