// Trace of a CCL sequence: replay equals eager bit for bit, with new input values too, and
// replays without planning (the program cache is not consulted).
#include <gtest/gtest.h>

#include <vector>

#include "dist/ccl/ccl.hpp"
#include "src/core/tensor.hpp"
#include "src/perf/program_cache.hpp"
#include "src/perf/trace.hpp"

namespace meshtest::dist {
namespace {

/// [4, 5] with element k = scale * (device + 1) + k.
Tensor input(const MeshDevice& mesh, DType t, double scale) {
  std::vector<double> v(20);
  for (std::size_t k = 0; k < v.size(); ++k) {
    v[k] = scale * (mesh.device_id() + 1) + static_cast<double>(k % 9);
  }
  return Tensor::from_vector(Shape{4, 5}, v).astype(t);
}

/// Four CCLs, each reading the previous output; `keep` holds each output.
template <class Keep>
void sequence(const MeshDevice& mesh, const Tensor& x, Keep&& keep) {
  const Tensor& g = keep(all_gather(mesh, x, {.dim = 1}));                           // [4, 5p]
  const Tensor& r = keep(all_reduce(mesh, g, {.op = ReduceOp::sum}));                // [4, 5p]
  const Tensor& s = keep(reduce_scatter(mesh, r, {.dim = 1, .op = ReduceOp::avg}));  // [4, 5]
  keep(all_to_all(mesh, s, {.split_dim = 0, .concat_dim = 1}));
}

std::vector<Tensor> eager(const MeshDevice& mesh, const Tensor& x) {
  std::vector<Tensor> out;
  out.reserve(4);
  sequence(mesh, x, [&](Tensor t) -> const Tensor& { return out.emplace_back(std::move(t)); });
  return out;
}

void expect_replay_equals_eager(DType t) {
  const MeshDevice mesh = MeshDevice::line();
  perf::Trace trace;
  Tensor& x = trace.input(input(mesh, t, 10));
  std::vector<const Tensor*> kept;
  trace.capture([&] {
    sequence(mesh, x, [&](Tensor y) -> const Tensor& {
      return *kept.emplace_back(&trace.keep(std::move(y)));
    });
  });
  ASSERT_EQ(trace.ops(),
            (std::vector<std::string>{"all_gather", "all_reduce", "reduce_scatter", "all_to_all"}));
  for (double scale : {10.0, 3.0, 7.0}) {
    const Tensor fresh = input(mesh, t, scale);
    std::copy_n(fresh.bytes(), fresh.nbytes(), x.bytes());  // update the input in place
    const std::int64_t lookups = perf::program_cache().hits() + perf::program_cache().misses();
    trace.replay();
    EXPECT_EQ(perf::program_cache().hits() + perf::program_cache().misses(), lookups)
        << "replay planned";
    const std::vector<Tensor> want = eager(mesh, fresh);
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(kept[i]->bitwise_equal(want[i]))
          << "step " << i << " scale " << scale << ": " << describe(*kept[i]) << " vs "
          << describe(want[i]);
    }
  }
}

TEST(CclTrace, ReplayEqualsEagerF32) { expect_replay_equals_eager(DType::f32); }
TEST(CclTrace, ReplayEqualsEagerBf16) { expect_replay_equals_eager(DType::bf16); }

TEST(CclTrace, CacheOffStillTraces) {
  const perf::ProgramCacheSwitch off(false);
  expect_replay_equals_eager(DType::f64);
}

}  // namespace
}  // namespace meshtest::dist
