// Demo section: FSDP DP-SGD over every device of the mesh against a single device — parameter
// difference after 5 noisy steps and per-sample norms (within the error model of the same sums in
// another order, src/check/tolerance.hpp), and the DP modes' time ratios.
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "dist/ccl/all_gather.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "dist/parallel/fsdp.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "tools/demo_sections.hpp"

namespace meshtest::dist {
namespace {

constexpr std::int64_t kBatch = 12, kSeq = 8, kIn = 24;
constexpr int kSteps = 5;

// n of the error model for one noisy DP step of `m` on `batch` samples of `seq` positions over
// `p` devices, counted as the tests' dp_terms (tests/support/dp_reference.hpp) count a clipped
// sum: the forward and backward reductions (a Linear over its inputs, +1 for the bias, and its
// outputs; an RMSNorm over its width both ways), the loss over the outputs, the per-sample norm
// (seq² Gram products and every parameter element), the clipped sum over the batch · seq
// tokens; then the reduce_scatter over p, the noise and the optimizer's update (4).
std::int64_t step_terms(const dp::Sequential& m, std::int64_t in, std::int64_t seq,
                        std::int64_t batch, int p) {
  std::int64_t n = m.out_features(in) + seq * seq + batch * seq + p + 4;
  for (const dp::Param* q : m.parameters()) {
    n += q->shape.numel();
    if (q->shape.rank() == 2) {
      n += q->shape[0] + q->shape[1];
    } else if (q->name.ends_with("bias")) {
      n += 1;
    } else {
      n += 2 * q->shape[0];
    }
  }
  return n;
}

// max |a − b| / max |b| over every element of every tensor.
double max_rel_diff(const std::vector<Tensor>& a, const std::vector<const dp::Param*>& b) {
  double num = 0, den = 0;
  for (std::size_t p = 0; p < a.size(); ++p) {
    for (std::int64_t j = 0; j < a[p].numel(); ++j) {
      num = std::max(num, std::abs(a[p].item(j) - b[p]->value.item(j)));
      den = std::max(den, std::abs(b[p]->value.item(j)));
    }
  }
  return num / den;
}

// Median seconds of one gradient computation per mode, on this device alone.
std::vector<double> mode_times(const std::vector<std::string>& modes) {
  const dp::Sequential m =
      dp::parse_model("linear:256,gelu,linear:256,gelu,linear:256", 256, DType::f32, {.seed = 3});
  const Tensor x = random_normal({4, 128, 256}, DType::f32, {.seed = 4});
  const Tensor y = random_normal({4, 128, 256}, DType::f32, {.seed = 5});
  std::vector<std::vector<double>> secs(modes.size());
  for (int it = 0; it < 4; ++it) {
    for (std::size_t k = 0; k < modes.size(); ++k) {
      dp::PrivateModel pm(m, modes[k], {.clip = 1.0});
      const auto t0 = std::chrono::steady_clock::now();
      pm.compute(x, y);
      if (it > 0) {
        secs[k].push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
  }
  std::vector<double> med;
  for (auto& s : secs) {
    std::sort(s.begin(), s.end());
    med.push_back(s[s.size() / 2]);
  }
  return med;
}

}  // namespace

int demo_dpsgd(const MeshDevice& mesh) {
  const double t0 = MPI_Wtime();
  const int n = mesh.size(), r = mesh.device_id();
  const dp::Sequential model =
      dp::parse_model("linear:32,gelu,rmsnorm,linear:16", kIn, DType::f64, {.seed = 1});
  const dp::DpSgdOptions opt{.mode = "fused_bk",
                             .dp = {.clip = 22.5, .loss = dp::LossKind::ce},
                             .noise = {.sigma = 1.0, .seed = 2026},
                             .optimizer = {.kind = dp::OptimizerKind::adam, .lr = 0.01}};
  FsdpDpSgd fsdp(mesh, model, opt);
  dp::DpSgd single(model, opt);
  const Range mine = split_range(kBatch, n, r);
  Tensor norms, want_norms, coef;
  for (int s = 0; s < kSteps; ++s) {
    const Tensor x = random_normal({kBatch, kSeq, kIn}, DType::f64,
                                   {.seed = 7, .stream = static_cast<std::uint64_t>(s)});
    const Tensor y = random_integers({kBatch, kSeq}, DType::i64,
                                     {.seed = 8, .stream = static_cast<std::uint64_t>(s)}, 0, 15);
    const dp::StepReport got = fsdp.step(x.slice(0, mine), y.slice(0, mine));
    const dp::StepReport want = single.step(x, y);
    norms = all_gather(mesh, got.norms, {.dim = 0});
    want_norms = want.norms;
    coef = want.coef;
  }
  const std::vector<Tensor> params = fsdp.gather_parameters();
  const std::vector<const dp::Param*> want_params = single.model().parameters();
  const double param_diff = max_rel_diff(params, want_params);
  // The same f64 steps in another order (each device's samples, then the reduce_scatter); each
  // step's error enters the next through the parameters: n adds up over the steps. S = max
  // |expected| of each tensor.
  const ErrorModel error_model{.dtype = DType::f64,
                               .terms = kSteps * step_terms(model, kIn, kSeq, kBatch, n),
                               .reference = Reference::other_order};
  double param_ratio = 0;
  bool params_ok = true;
  for (std::size_t p = 0; p < params.size(); ++p) {
    const Comparison c = compare(want_params[p]->value, params[p], error_model);
    param_ratio = std::max(param_ratio, c.value);
    params_ok = params_ok && c.passed;
  }
  const Comparison norms_cmp = compare(want_norms, norms, error_model);
  const bool ok = params_ok && norms_cmp.passed;
  const std::vector<std::string> modes = {"non_private", "hooks", "ghost", "fused", "fused_bk"};
  std::vector<double> times;
  if (r == 0) times = mode_times(modes);
  MESHTEST_MPI(MPI_Barrier(mesh.comm()));
  if (r == 0) {
    fmt::print(
        "\nDP-SGD under FSDP: {} devices each hold 1/{} of every parameter and their own samples "
        "(B = {}, T = {}); model linear:32,gelu,rmsnorm,linear:16, ce loss, mode fused_bk, C = {}, "
        "sigma = {}, Adam\n",
        n, n, kBatch, kSeq, opt.dp.clip, opt.noise.sigma);
    fmt::print(
        "  after {} noisy steps, max relative parameter difference FSDP vs one device: {:.2e}, "
        "error / bound {:.3g} ({}: {})\n",
        kSteps, param_diff, param_ratio, error_model.str(), params_ok ? "PASS" : "FAIL");
    fmt::print("  per-sample norms: error / bound {:.3g} ({})\n", norms_cmp.value,
               norms_cmp.passed ? "PASS" : "FAIL");
    fmt::print(
        "  per-sample gradient norms of step {} (each computed on the device that owns the "
        "sample, never reduced across devices):\n",
        kSteps);
    fmt::print("    {:>6} {:>6} {:>14} {:>14} {:>9} {:>8}\n", "sample", "device", "FSDP norm",
               "1-device norm", "rel diff", "clip c");
    for (std::int64_t i = 0; i < kBatch; ++i) {
      int owner = 0;
      while (!(i < split_range(kBatch, n, owner).start + split_range(kBatch, n, owner).size))
        ++owner;
      fmt::print("    {:>6} {:>6} {:>14.9f} {:>14.9f} {:>9.1e} {:>8.4f}\n", i, owner, norms.item(i),
                 want_norms.item(i),
                 std::abs(norms.item(i) - want_norms.item(i)) / want_norms.item(i), coef.item(i));
    }
    fmt::print("  mode step time / non_private (one device, 3 x Linear 256, B = 4, T = 128, f32):");
    for (std::size_t k = 0; k < modes.size(); ++k)
      fmt::print(" {} {:.2f}", modes[k], times[k] / times[0]);
    fmt::print("\n  DP-SGD check: {}; wall {:.1f} s\n", ok ? "PASS" : "FAIL", MPI_Wtime() - t0);
  }
  return ok ? 0 : 1;
}

}  // namespace meshtest::dist
