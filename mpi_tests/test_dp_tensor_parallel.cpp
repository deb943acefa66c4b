// Tensor-parallel DP: a column-parallel last Linear; partial squared norms all-reduced once
// (B values) equal the single-device per-sample norms; clipped grads equal the single device's,
// within the error model of the step's chain (src/check/tolerance.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/dp_tensor_parallel.hpp"
#include "mpi_tests/support/ccl_expect_error.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/perf/profiler.hpp"
#include "tests/support/dp_reference.hpp"

namespace meshtest::dist {
namespace {

using ccl_test::expect_error;
using test_support::coef_scale;
using test_support::dp_terms;
using test_support::DpTerms;
using test_support::expect_within;

struct Case {
  std::string spec;
  std::int64_t din, out, batch, seq;
  dp::Reduction reduction;
};

void run_case(const MeshDevice& mesh, const Case& c) {
  const std::string l = fmt::format("{} B={} T={} {} np={}", c.spec, c.batch, c.seq,
                                    dp::reduction_name(c.reduction), mesh.size());
  const dp::Sequential full = dp::parse_model(c.spec, c.din, DType::f64, {.seed = 31});
  const Shape xs = c.seq == 0 ? Shape{c.batch, c.din} : Shape{c.batch, c.seq, c.din};
  const Tensor x = random_normal(xs, DType::f64, {.seed = 32});
  const Tensor y = random_normal(xs.with(xs.rank() - 1, c.out), DType::f64, {.seed = 33});
  dp::DpOptions opt{.clip = 1, .reduction = c.reduction};
  // Reference: per-sample gradients instantiated (hooks) on one device; C = the median norm.
  const dp::DpGrads probe = dp::PrivateModel(full, "hooks", opt).compute(x, y);
  std::vector<double> sorted(probe.norms.span<double>().begin(), probe.norms.span<double>().end());
  std::sort(sorted.begin(), sorted.end());
  opt.clip = sorted[sorted.size() / 2];
  const dp::DpGrads ref = dp::PrivateModel(full, "hooks", opt).compute(x, y);

  ColumnParallelModel tp = split_last_linear(mesh, full);
  const Range rows = split_range(c.out, mesh.size(), mesh.device_id());
  perf::Session session;
  const TpDpGrads got = tp_clipped_grads(mesh, tp, x, y.slice(y.rank() - 1, rows), opt);
  std::vector<std::int64_t> reduced;
  for (const auto& rec : perf::records()) {
    if (rec.op_code == "all_reduce_inplace") reduced.push_back(rec.inputs.at(0).shape.numel());
  }
  // One all_reduce of the B partial norms (plus the head's input grad when there is a prefix).
  EXPECT_EQ(std::count(reduced.begin(), reduced.end(), c.batch), 1) << l;
  EXPECT_EQ(reduced.size(), tp.prefix.size() > 0 ? 2u : 1u) << l;

  // The same step in another order (dp_terms; the partial norms, and the head's input grad,
  // then all_reduced over the devices), f64.
  const DpTerms terms = dp_terms(full, x);
  const auto model = [&](std::int64_t n) {
    return ErrorModel{
        .dtype = DType::f64, .terms = n + mesh.size(), .reference = Reference::other_order};
  };
  expect_within(ref.norms, got.norms, model(terms.norm), l + " norms");
  expect_within(ref.coef, got.coef, model(terms.norm), l + " coef",
                coef_scale(ref.norms, ref.coef));
  const std::size_t np = got.prefix_grads.size();
  for (std::size_t p = 0; p < np; ++p) {
    expect_within(ref.grads[p], got.prefix_grads[p], model(terms.clipped),
                  fmt::format("{} prefix {}", l, p));
  }
  for (std::size_t p = 0; p < got.head_grads.size(); ++p) {
    expect_within(ref.grads[np + p].slice(0, rows), got.head_grads[p], model(terms.clipped),
                  fmt::format("{} head {}", l, p));
  }
}

TEST(DpTensorParallel, PartialNormsAllReducedEqualSingleDevice) {
  const MeshDevice mesh = MeshDevice::line();
  run_case(mesh, {"linear:6,gelu,rmsnorm,linear:7", 5, 7, 4, 3, dp::Reduction::mean});
  run_case(mesh, {"rmsnorm,linear:9", 5, 9, 5, 0, dp::Reduction::sum});
  run_case(mesh, {"linear:11", 4, 11, 3, 6, dp::Reduction::mean});  // no replicated prefix
}

TEST(DpTensorParallel, ReplicatedNormsCountedOnce) {
  // Had every device added the replicated prefix's norms, they would count N times: the norms
  // would differ from the single device's as soon as N > 1. Checked through the same path.
  const MeshDevice mesh = MeshDevice::line();
  run_case(mesh, {"linear:6,relu,linear:2", 3, 2, 4, 2, dp::Reduction::sum});
}

TEST(DpTensorParallel, BadInput) {
  const MeshDevice mesh = MeshDevice::line();
  const dp::Sequential full = dp::parse_model("linear:6,relu,linear:4", 3, DType::f64, {.seed = 1});
  ColumnParallelModel tp = split_last_linear(mesh, full);
  const Range rows = split_range(4, mesh.size(), mesh.device_id());
  const Tensor x = random_normal({2, 3}, DType::f64, {.seed = 2});
  const Tensor y = random_normal({2, rows.size}, DType::f64, {.seed = 3});
  expect_error(mesh, kAllAxes, "ce loss",
               [&] { tp_clipped_grads(mesh, tp, x, y, {.clip = 1, .loss = dp::LossKind::ce}); },
               {"tensor-parallel DP step", "supports the mse loss only"});
  expect_error(mesh, kAllAxes, "clip", [&] { tp_clipped_grads(mesh, tp, x, y, {.clip = -1}); },
               {"clip norm C is -1, expected a finite C > 0"});
  expect_error(mesh, kAllAxes, "input width",
               [&] {
                 tp_clipped_grads(mesh, tp, random_normal({2, 4}, DType::f64, {}), y, {});
               },
               {"4 features, expected 3"});
  expect_error(mesh, kAllAxes, "last layer",
               [&] { split_last_linear(mesh, dp::parse_model("linear:3,relu", 3, DType::f64)); },
               {"split_last_linear: the model's last layer must be a plain Linear"});
}

}  // namespace
}  // namespace meshtest::dist
