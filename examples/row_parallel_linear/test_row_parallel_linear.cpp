// test_row_parallel_linear: the row-parallel linear on a line of 1..N devices against its
// single-device reference: a closed form, exact on integer inputs, PCC and allclose on random
// ones, the same bits on every device, and bad input.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dist/ccl/broadcast.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "dist/shard/placement.hpp"
#include "dist/testing/harness/fixtures.hpp"
#include "dist/testing/harness/single_device.hpp"
#include "row_parallel_linear.hpp"
#include "src/check/compare.hpp"
#include "src/core/error.hpp"
#include "src/core/random.hpp"

namespace row_parallel {
namespace {

using meshtest::Comparison;
using meshtest::DType;
using meshtest::Metric;
using meshtest::RandomKey;
using meshtest::Shape;
using meshtest::Tensor;
using meshtest::Tolerance;
using meshtest::dist::kReplicated;
using meshtest::dist::MeshDevice;
using meshtest::dist::placements_1d;
using meshtest::dist::Shard;
using meshtest::dist::testing::expect_matches_single_device;
using meshtest::dist::testing::MatchOptions;
using meshtest::dist::testing::MeshTest;

using RowParallelLinear = MeshTest;

// The sharded op against reference_linear: x [M, K] and w [N, K] split along K (dim 1) over the
// line by meshtest's placements (array_split: uneven and empty slices allowed), the bias whole
// on every device, y compared on device 0 (the verdict is agreed by every device).
Comparison check_against_reference(const MeshDevice& mesh, const Tensor& x, const Tensor& w,
                                   const Tensor& bias, MatchOptions opt) {
  opt.label = fmt::format("M={} K={} N={} {}{}{}", x.shape()[0], x.shape()[1], w.shape()[0],
                          x.dtype(), opt.label.empty() ? "" : " ", opt.label);
  return expect_matches_single_device(
      mesh,
      {{.full = x, .placements = placements_1d(Shard{1})},
       {.full = w, .placements = placements_1d(Shard{1})},
       {.full = bias, .placements = kReplicated}},
      [](const std::vector<Tensor>& full) { return reference_linear(full[0], full[1], full[2]); },
      [](const MeshDevice& m, const std::vector<Tensor>& local) {
        return row_parallel_linear(m, local[0], local[1], local[2]);
      },
      kReplicated, opt);
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

TEST_F(RowParallelLinear, ClosedFormOnEveryDevice) {
  // x = 1, W[n, k] = k + 1, b[n] = n  =>  y[m, n] = K (K + 1) / 2 + n, exact in f32. Each device
  // builds only its own slices (k_slice) and checks its own y.
  const std::int64_t m_size = 3, n_size = 5, k = 4 * mesh().size();
  const meshtest::Range r = k_slice(mesh(), k);
  Tensor x(Shape{m_size, r.size}, DType::f32);
  x.fill(1.0);
  Tensor w(Shape{n_size, r.size}, DType::f32);
  Tensor bias(Shape{n_size}, DType::f32);
  for (std::int64_t n = 0; n < n_size; ++n) {
    bias.data<float>()[n] = static_cast<float>(n);
    for (std::int64_t j = 0; j < r.size; ++j) {
      w.data<float>()[n * r.size + j] = static_cast<float>(r.start + j + 1);
    }
  }
  const Tensor y = row_parallel_linear(mesh(), x, w, bias);
  ASSERT_EQ(y.shape(), (Shape{m_size, n_size}));
  for (std::int64_t m = 0; m < m_size; ++m) {
    for (std::int64_t n = 0; n < n_size; ++n) {
      EXPECT_EQ(y.item(m * n_size + n), static_cast<double>(k * (k + 1) / 2 + n))
          << "y[" << m << ", " << n << "] with K = " << k << " on device " << mesh().device_id();
    }
  }
}

TEST_F(RowParallelLinear, ExactOnIntegerInputs) {
  // Small integers: every partial product and sum is exact in f32, whatever the order, so the
  // sharded result equals the reference bit for bit. K = 13 gives uneven slices at np 2, 3, 4;
  // K = 3 empty ones from np 4; K = 0 leaves only the bias.
  for (const std::int64_t k : {13, 3, 0}) {
    const Tensor x = meshtest::random_integers({5, k}, DType::f32, {.seed = 11}, -4, 4);
    const Tensor w = meshtest::random_integers({7, k}, DType::f32, {.seed = 12}, -4, 4);
    const Tensor b = meshtest::random_integers({7}, DType::f32, {.seed = 13}, -8, 8);
    const Comparison c = check_against_reference(mesh(), x, w, b, {.metric = Metric::exact});
    EXPECT_TRUE(c.passed) << "K = " << k;
  }
}

struct RandomCase {
  DType dtype;
  double min_pcc;
  Tolerance tolerance;
};

TEST_F(RowParallelLinear, RandomNormalInputsMatchByPccAndTolerance) {
  // The sharded sum runs in another order (and bf16 rounds each partial product), so the
  // comparison is numerical: PCC, and allclose under a tolerance of the dtype.
  for (const RandomCase& rc : {RandomCase{DType::f32, 0.99999, {.rtol = 1e-5, .atol = 1e-4}},
                               RandomCase{DType::f64, 0.9999999, {.rtol = 1e-12, .atol = 1e-12}},
                               RandomCase{DType::bf16, 0.999, {.rtol = 2e-2, .atol = 1e-1}}}) {
    const Tensor x = meshtest::random_normal({6, 97}, rc.dtype, {.seed = 21});
    const Tensor w = meshtest::random_normal({10, 97}, rc.dtype, {.seed = 22});
    const Tensor b = meshtest::random_normal({10}, rc.dtype, {.seed = 23});
    const Comparison pcc =
        check_against_reference(mesh(), x, w, b, {.metric = Metric::pcc, .threshold = rc.min_pcc});
    EXPECT_TRUE(pcc.passed) << pcc;
    const Comparison close = check_against_reference(
        mesh(), x, w, b, {.metric = Metric::allclose, .tolerance = rc.tolerance});
    EXPECT_TRUE(close.passed) << close;
  }
}

TEST_F(RowParallelLinear, EveryDeviceGetsTheSameBits) {
  const std::int64_t k = 8 * mesh().size();
  const meshtest::Range r = k_slice(mesh(), k);
  const RandomKey kx{.seed = 31}, kw{.seed = 32};
  const Tensor x = meshtest::generate_slice({4, k}, 1, r, DType::f32, kx, meshtest::Normal{});
  const Tensor w = meshtest::generate_slice({6, k}, 1, r, DType::f32, kw, meshtest::Normal{});
  const Tensor b = meshtest::random_normal({6}, DType::f32, {.seed = 33});
  const Tensor y = row_parallel_linear(mesh(), x, w, b);
  const Tensor y0 = meshtest::dist::broadcast(mesh(), y, {.root = 0});
  EXPECT_TRUE(y.bitwise_equal(y0)) << "device " << mesh().device_id() << " differs from device 0";
}

// ------------------------------------------------------------------------------- bad input

TEST_F(RowParallelLinear, KThatDoesNotSplitEvenlyIsNamed) {
  EXPECT_HAS_TEXT(error_of([&] { k_slice(mesh(), -1); }), "K = -1 does not split evenly");
  const int p = mesh().size();
  if (p > 1) {
    EXPECT_HAS_TEXT(error_of([&] { k_slice(mesh(), p + 1); }),
                    fmt::format("K = {} does not split evenly over the {} devices", p + 1, p));
  }
}

TEST_F(RowParallelLinear, LocalShapesThatDoNotFitThrowBeforeAnyCollective) {
  // Every device gets the same bad shapes and throws before communicating: no hang.
  const Tensor x(Shape{2, 3}, DType::f32), w(Shape{4, 3}, DType::f32), b(Shape{4}, DType::f32);
  const Tensor w_other_k(Shape{4, 2}, DType::f32), b_long(Shape{5}, DType::f32);
  const Tensor b_f64(Shape{4}, DType::f64);
  EXPECT_HAS_TEXT(error_of([&] { row_parallel_linear(mesh(), x, w_other_k, b); }),
                  "x_local [2, 3] and w_local [4, 2] hold different slices of K");
  EXPECT_HAS_TEXT(error_of([&] { row_parallel_linear(mesh(), x, w, b_long); }),
                  "bias [5] does not match N = 4");
  EXPECT_HAS_TEXT(error_of([&] { row_parallel_linear(mesh(), x, w, b_f64); }),
                  "dtypes differ (x f32, w f32, bias f64)");
}

TEST_F(RowParallelLinear, DevicesThatDisagreeOnNAllGetTheError) {
  if (mesh().size() < 2) {
    GTEST_SKIP() << "needs 2 devices to disagree";
  }
  // Device 1 has N = 5, the others N = 4: each is consistent locally, so meshtest's all_reduce
  // finds the disagreement and throws on every device; the mesh stays usable afterwards.
  const std::int64_t n_size = mesh().device_id() == 1 ? 5 : 4;
  const Tensor x(Shape{2, 3}, DType::f32), w(Shape{n_size, 3}, DType::f32);
  const Tensor b(Shape{n_size}, DType::f32);
  const std::string error = error_of([&] { row_parallel_linear(mesh(), x, w, b); });
  EXPECT_HAS_TEXT(error, "shapes disagree");
  EXPECT_HAS_TEXT(error, "[2, 5]");
  Tensor one(Shape{1, 1}, DType::f32);
  one.fill(1.0);
  const Tensor y = row_parallel_linear(mesh(), one, one, Tensor(Shape{1}, DType::f32));
  EXPECT_EQ(y.item(0), mesh().size());
}

}  // namespace
}  // namespace row_parallel
