// The FSDP DP-SGD tests' problem, shared by CPU ranks (mpi_tests/test_fsdp_dpsgd.cpp) and GPU
// ranks (mpi_tests/gpu/test_gpu_fsdp_dp.cpp): the model, each step's global batch, the cases
// (mode, dtype, loss, reduction, optimizer, batch, noise) and a clip norm that clips about half
// of the samples.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "src/core/random.hpp"
#include "src/dp/dp_sgd.hpp"
#include "src/dp/loss.hpp"
#include "src/perf/profiler.hpp"
#include "tests/support/dp_reference.hpp"

namespace meshtest::dist::fsdp_test {

constexpr const char* kSpec = "linear:7,gelu,rmsnorm,linear:5";
constexpr std::int64_t kIn = 6, kOut = 5, kSeq = 3;
constexpr int kSteps = 10;

struct Batch {
  Tensor x, y;
};

/// The global batch of a step: x [B, T, 6], mse targets [B, T, 5] or ce classes [B, T].
inline Batch global_batch(std::int64_t b, int step, DType dt, dp::LossKind loss) {
  const auto s = static_cast<std::uint64_t>(step);
  Batch r{.x = random_normal({b, kSeq, kIn}, dt, {.seed = 1000, .stream = s}), .y = {}};
  r.y = loss == dp::LossKind::mse
            ? random_normal({b, kSeq, kOut}, dt, {.seed = 2000, .stream = s})
            : random_integers({b, kSeq}, DType::i64, {.seed = 3000, .stream = s}, 0, kOut - 1);
  return r;
}

struct Case {
  std::string mode;
  DType dtype;
  dp::LossKind loss;
  dp::Reduction reduction;
  dp::OptimizerKind optimizer;
  std::int64_t batch;  ///< global; < np leaves some devices without samples
  double sigma = 0.6;  ///< the noise multiplier
};

inline std::string label(const Case& c, int np) {
  return fmt::format("mode={} {} loss={} reduction={} opt={} B={} sigma={} np={}", c.mode,
                     dtype_name(c.dtype), dp::loss_name(c.loss), dp::reduction_name(c.reduction),
                     c.optimizer == dp::OptimizerKind::sgd ? "sgd" : "adam", c.batch, c.sigma, np);
}

/// Every private mode with Adam (mse, mean), fused_bk with SGD (ce, sum) and non_private, f64.
inline std::vector<Case> noisy_f64_cases() {
  std::vector<Case> out;
  for (const std::string mode : {"fused_bk", "fused", "ghost", "hooks"}) {
    out.push_back(
        {mode, DType::f64, dp::LossKind::mse, dp::Reduction::mean, dp::OptimizerKind::adam, 11});
  }
  out.push_back(
      {"fused_bk", DType::f64, dp::LossKind::ce, dp::Reduction::sum, dp::OptimizerKind::sgd, 11});
  out.push_back({"non_private", DType::f64, dp::LossKind::mse, dp::Reduction::mean,
                 dp::OptimizerKind::sgd, 9});
  return out;
}

/// B = 3 over more than 3 devices: some hold no sample in a step (legal).
inline std::vector<Case> devices_without_samples_cases() {
  return {
      {"fused_bk", DType::f64, dp::LossKind::mse, dp::Reduction::mean, dp::OptimizerKind::adam, 3},
      {"fused", DType::f64, dp::LossKind::ce, dp::Reduction::mean, dp::OptimizerKind::sgd, 3}};
}

/// C = the median per-sample norm of the first batch: some samples are clipped, some not.
inline double median_norm(const dp::Sequential& model, const Batch& b, const dp::DpOptions& opt) {
  const dp::DpGrads g = dp::PrivateModel(model, "hooks", opt).compute(b.x, b.y);
  std::vector<double> n;
  for (std::int64_t i = 0; i < g.norms.numel(); ++i) n.push_back(g.norms.item(i));
  std::sort(n.begin(), n.end());
  return n[n.size() / 2];
}

/// The options of case c: its mode, loss, reduction, noise (seed 77) and optimizer (lr 0.05),
/// C at the median norm of its first batch.
inline dp::DpSgdOptions options_of(const Case& c, const dp::Sequential& model) {
  dp::DpSgdOptions opt{.mode = c.mode,
                       .dp = {.clip = 1, .loss = c.loss, .reduction = c.reduction},
                       .noise = {.sigma = c.sigma, .seed = 77},
                       .optimizer = {.kind = c.optimizer, .lr = 0.05}};
  opt.dp.clip = median_norm(model, global_batch(c.batch, 0, c.dtype, c.loss), opt.dp);
  return opt;
}

/// fused_bk gathers every parameter once for forward and once for backward, ghost once more for
/// its second backward, and both reduce-scatter each parameter once: `step(mode, batch, mine)`
/// runs one FSDP step of `mode` (C = 1e-3, every sample clipped) on this device's rows `mine` of
/// a batch of 4, and the perf records of that step are counted.
inline void expect_gathers_per_pass(
    const MeshDevice& mesh,
    const std::function<void(const std::string&, const Batch&, Range)>& step) {
  const std::size_t params =
      dp::parse_model(kSpec, kIn, DType::f64, {.seed = 5}).parameters().size();  // 5
  for (const auto& [mode, gathers] : std::vector<std::pair<std::string, std::size_t>>{
           {"fused_bk", 2 * params}, {"ghost", 3 * params}}) {
    const Batch all = global_batch(4, 0, DType::f64, dp::LossKind::mse);
    const Range mine = split_range(4, mesh.size(), mesh.device_id());
    perf::Session session;
    step(mode, all, mine);
    std::size_t ag = 0, rs = 0;
    for (const auto& rec : perf::records()) {
      ag += rec.op_code == "all_gather";
      rs += rec.op_code == "reduce_scatter";
    }
    EXPECT_EQ(ag, gathers) << mode;
    EXPECT_EQ(rs, params) << mode;
  }
}

/// A case's checks of N devices' steps against one device's (the CPU's DpSgd on the whole batch),
/// each within the error model of the steps' chain: the same steps in other orders (dp_terms:
/// each device's samples, then the reduce_scatter over n devices, the noise and the optimizer's
/// update: 4), each step's error entering the next through the parameters.
class StepChecks {
 public:
  StepChecks(const dp::Sequential& model, const Case& c, int devices)
      : c_(c),
        per_step_(
            test_support::dp_terms(model, global_batch(c.batch, 0, c.dtype, c.loss).x).clipped +
            devices + 4) {}

  /// The model after `steps` steps.
  ErrorModel after(int steps) const {
    return {.dtype = c_.dtype, .terms = steps * per_step_, .reference = Reference::other_order};
  }

  /// Step `step`'s norms and coefficients of this device's samples `mine` (complete here, never
  /// reduced across devices) against the single device's.
  void step(int step, const dp::StepReport& got, const dp::StepReport& want, Range mine) {
    if (c_.mode == "non_private") return;
    ASSERT_EQ(got.norms.shape(), Shape{mine.size});
    const std::string at = fmt::format("step {}", step);
    const Tensor want_norms = want.norms.slice(0, mine), want_coef = want.coef.slice(0, mine);
    test_support::expect_within(want_norms, got.norms, after(step + 1), at + " norms");
    test_support::expect_within(want_coef, got.coef, after(step + 1), at + " coef",
                                test_support::coef_scale(want_norms, want_coef));
    for (std::int64_t i = 0; i < want.coef.numel(); ++i)
      (want.coef.item(i) < 1 ? clipped_ : unclipped_)++;
  }

  /// After the steps: C clipped some samples and left others.
  void finish() const {
    if (c_.mode == "non_private") return;
    EXPECT_GT(clipped_, 0) << "C should clip some samples";
    EXPECT_GT(unclipped_, 0) << "and leave others";
  }

 private:
  Case c_;
  std::int64_t per_step_;
  int clipped_ = 0, unclipped_ = 0;
};

}  // namespace meshtest::dist::fsdp_test
