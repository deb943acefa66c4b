// The CCLs' program cache: repeated calls reuse their plan (hit/miss counters), results are the
// same with the cache off, and a warm cache still catches a mismatch on every device.
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "dist/ccl/ccl.hpp"
#include "dist/ccl/paths/shm/shm.hpp"
#include "mpi_tests/support/ccl_expect_error.hpp"
#include "src/core/tensor.hpp"
#include "src/perf/program_cache.hpp"

namespace meshtest::dist {
namespace {

/// [rows, cols] with element k = 100 * (device + 1) + k (exact in f32).
Tensor device_tensor(const MeshDevice& mesh, std::int64_t rows, std::int64_t cols) {
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::size_t k = 0; k < v.size(); ++k) {
    v[k] = static_cast<float>(100 * (mesh.device_id() + 1) + static_cast<int>(k));
  }
  return Tensor::from_vector(Shape{rows, cols}, v);
}

/// The same collective sequence, each output kept.
std::vector<Tensor> sequence(const MeshDevice& mesh, const Tensor& x) {
  std::vector<Tensor> out;
  out.push_back(all_gather(mesh, x, {.dim = 1}));
  out.push_back(reduce_scatter(mesh, out.back(), {.dim = 1}));
  out.push_back(all_to_all(mesh, x, {.split_dim = 1, .concat_dim = 1}));
  out.push_back(all_reduce(mesh, x, {.op = ReduceOp::max}));
  return out;
}

TEST(CclCache, RepeatedCallsHitThePlan) {
  const MeshDevice mesh = MeshDevice::line();
  perf::ProgramCache& cache = perf::program_cache();
  cache.clear();
  const Tensor x = device_tensor(mesh, 3, 2 * mesh.size());
  const Tensor a = all_gather(mesh, x, {.dim = 1});
  EXPECT_EQ(cache.misses(), 1);
  EXPECT_EQ(cache.hits(), 0);
  const Tensor b = all_gather(mesh, x, {.dim = 1});
  EXPECT_EQ(cache.misses(), 1);
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_TRUE(a.bitwise_equal(b));
  (void)reduce_scatter(mesh, x, {.dim = 1});
  (void)reduce_scatter(mesh, x, {.dim = 1});
  (void)all_to_all(mesh, x, {.split_dim = 1, .concat_dim = 1});
  (void)all_to_all(mesh, x, {.split_dim = 1, .concat_dim = 1});
  EXPECT_EQ(cache.misses(), 3);
  EXPECT_EQ(cache.hits(), 3);
  // Another shape, dim or op is another signature.
  (void)all_gather(mesh, device_tensor(mesh, 3, 5), {.dim = 1});
  (void)all_gather(mesh, x, {.dim = 0});
  (void)reduce_scatter(mesh, x, {.dim = 1, .op = ReduceOp::max});
  EXPECT_EQ(cache.misses(), 6);
  EXPECT_EQ(cache.hits(), 3);
  EXPECT_EQ(cache.size(), 6u);
}

TEST(CclCache, SwitchedOffGivesTheSameResults) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor x = device_tensor(mesh, 4, 3 * mesh.size() + 1);  // uneven at every np > 1
  const std::vector<Tensor> on = sequence(mesh, x);
  const std::vector<Tensor> on_again = sequence(mesh, x);  // from cached plans
  std::vector<Tensor> off;
  {
    const perf::ProgramCacheSwitch sw(false);
    perf::program_cache().clear();
    off = sequence(mesh, x);
    EXPECT_EQ(perf::program_cache().hits(), 0);
    // all_reduce plans only on the MPI path (its reduce-scatter's workspaces), not through
    // the shared-memory group.
    const int all_reduce_plans = detail::ShmGroup::find(mesh.comm()) == nullptr ? 1 : 0;
    EXPECT_EQ(perf::program_cache().misses(), 3 + all_reduce_plans);
    EXPECT_EQ(perf::program_cache().size(), 0u);
  }
  ASSERT_EQ(on.size(), off.size());
  for (std::size_t i = 0; i < on.size(); ++i) {
    EXPECT_TRUE(on[i].bitwise_equal(off[i])) << "op " << i;
    EXPECT_TRUE(on[i].bitwise_equal(on_again[i])) << "op " << i;
  }
  // And they are right: the gathered columns are every device's x in order.
  std::vector<Tensor> parts;
  for (int d = 0; d < mesh.size(); ++d) {
    Tensor part = x;
    part.vector<float>().array() += static_cast<float>(100 * (d - mesh.device_id()));
    parts.push_back(part);
  }
  EXPECT_TRUE(on[0].bitwise_equal(concat(parts, 1)));
}

using ccl_test::expect_error;

TEST(CclCache, WarmCacheStillCatchesMismatch) {
  const MeshDevice mesh = MeshDevice::line();
  if (mesh.size() < 2) GTEST_SKIP() << "one device cannot disagree with itself";
  const Tensor x = device_tensor(mesh, 2, 3);
  for (int i = 0; i < 3; ++i) (void)all_gather(mesh, x, {.dim = 1});  // warm
  const Tensor other = mesh.device_id() == 0 ? device_tensor(mesh, 3, 3) : x;
  expect_error(mesh, kAllAxes, "shape", [&] { (void)all_gather(mesh, other, {.dim = 1}); },
               {"shapes disagree outside dim 1"});
  expect_error(mesh, kAllAxes, "dim",
               [&] { (void)all_gather(mesh, x, {.dim = mesh.device_id() == 0 ? 0 : 1}); },
               {"devices disagree on dim"});
  for (int i = 0; i < 3; ++i) (void)all_reduce(mesh, x);  // warm
  const Tensor wide = mesh.device_id() == 1 ? device_tensor(mesh, 2, 4) : x;
  expect_error(mesh, kAllAxes, "all_reduce shape", [&] { (void)all_reduce(mesh, wide); },
               {"shapes disagree"});
  // Still in step, and the cached plan still right.
  const Tensor g = all_gather(mesh, x, {.dim = 1});
  EXPECT_EQ(g.shape(), (Shape{2, 3 * mesh.size()}));
}

TEST(CclCache, UnevenPiecesAfterEvenOnes) {
  const MeshDevice mesh = MeshDevice::line();
  const int p = mesh.size();
  (void)all_gather(mesh, device_tensor(mesh, 2, 2), {.dim = 1});
  // Device i holds i + 1 columns: the cheap agreement differs, the full one gives the sizes.
  const Tensor x = device_tensor(mesh, 2, mesh.device_id() + 1);
  const Tensor g = all_gather(mesh, x, {.dim = 1});
  ASSERT_EQ(g.shape(), (Shape{2, p * (p + 1) / 2}));
  std::int64_t col = 0;
  for (int d = 0; d < p; ++d) {
    for (std::int64_t r = 0; r < 2; ++r) {
      for (std::int64_t k = 0; k < d + 1; ++k) {
        EXPECT_EQ(g.item(r * g.shape()[1] + col + k), 100 * (d + 1) + r * (d + 1) + k)
            << "device " << d << " row " << r << " col " << k;
      }
    }
    col += d + 1;
  }
}

}  // namespace
}  // namespace meshtest::dist
