// meshtest-demo section: the gpt-oss MoE MLP block expert parallel on the mesh (experts and
// tokens on axis 0, their units split over axis 1) against one device — the gathered output
// against mlp_block on the whole input (the error model of the same sums in another order,
// src/check/tolerance.hpp, and PCC), where the tokens and experts live, and a run with a capacity
// whose dropped slots match the single device's.
#include <fmt/format.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dist/mesh/mpi_check.hpp"
#include "dist/parallel/expert_parallel.hpp"
#include "dist/shard/placement.hpp"
#include "src/check/gpt_oss_chains.hpp"
#include "src/check/metrics.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/ops/elementwise.hpp"
#include "src/ops/linear.hpp"
#include "tools/demo_sections.hpp"

namespace meshtest::dist {
namespace {

constexpr std::int64_t kTokens = 32;
constexpr double kCapacityFactor = 1.0;

/// tiny() with 8 experts top-2 and intermediate 24 (split by TP 1, 2, 3, 4, 6 and 8).
GptOssConfig demo_config() {
  GptOssConfig c = GptOssConfig::tiny();
  c.num_experts = 8;
  c.intermediate_size = 24;
  return c;
}

/// The single-device block with the capacity: the slots apply_capacity drops (token order) get
/// routing weight 0, so they add nothing, as in ep_moe. Returns the output and the drop count.
std::pair<Tensor, std::int64_t> capacity_reference(const Tensor& x, const MlpWeights& w,
                                                   const GptOssConfig& c) {
  const MoeParams p = c.moe_params();
  const Tensor t = rms_norm(x, w.norm_scale, p.norm_eps);
  Routing r = route_top_k(linear(t, w.gate_weight, w.gate_bias), p.experts_per_token);
  Permutation perm = make_permutation(r, c.num_experts);
  const std::int64_t dropped =
      apply_capacity(perm, expert_capacity(r.num_tokens, r.k, c.num_experts, kCapacityFactor));
  for (const std::int64_t s : perm.dropped) r.weights.data<float>()[s] = 0.0F;
  const Tensor y = moe_experts(t, r, w.mlp1_weight, w.mlp1_bias, w.mlp2_weight, p);
  return {add(x, moe_combine(y, r, w.mlp2_bias)), dropped};
}

}  // namespace

int demo_moe(const MeshDevice& mesh) {
  const double t0 = MPI_Wtime();
  const bool root = mesh.device_id() == 0;
  const GptOssConfig c = demo_config();
  const EpOptions o{.ep_axis = 0};
  const TpRank ep = ep_rank(mesh, o), tp = ep_tp_rank(mesh, o);
  if (root) {
    fmt::print(
        "\nMoE MLP block, expert parallel (hidden {}, {} experts top-{}, intermediate {}), T = {} "
        "tokens, f32, random weights: experts and tokens on axis 0 (EP = {}), each expert's "
        "units on axis 1 (TP = {}), against mlp_block on one device\n",
        c.hidden_size, c.num_experts, c.experts_per_token, c.intermediate_size, kTokens, ep.size,
        tp.size);
  }
  if (c.intermediate_size % tp.size != 0) {
    if (root) fmt::print("skipped: TP = {} does not divide the intermediate\n", tp.size);
    return 0;
  }
  const MlpWeights full = init_mlp_weights(c, 0, DType::f32, RandomInit{44});
  const ExpertPlacement pl = place_experts(ExpertAssignment::Contiguous, c.num_experts, ep.size);
  const EpMlpWeights w = shard_ep_mlp_weights(
      weight_source(BlockWeights{.attn = {}, .mlp = full}, 0), c, 0, pl, ep.index, tp);
  const MoeParams p = c.moe_params();
  const Tensor x = random_normal(Shape{kTokens, c.hidden_size}, DType::f32, {.seed = 45});
  const Placements act = ep_activation_placements(o);
  const Tensor local = distribute(x, mesh, act);
  const Tensor got = gather_full(ep_mlp_block(mesh, local, w, p, o), mesh, act);

  // The same block through ep_moe with a capacity (the local routing, as ep_mlp_block's).
  const EpOptions capped{.ep_axis = 0, .capacity_factor = kCapacityFactor};
  const Tensor t = rms_norm(local, w.mlp.norm_scale, p.norm_eps);
  const EpMoeResult moe = ep_moe(
      mesh, t, route_top_k(linear(t, w.mlp.gate_weight, w.mlp.gate_bias), c.experts_per_token), w,
      p, capped);
  const Tensor got_capped = gather_full(add(local, moe.out), mesh, act);

  int failed = 0;
  if (root) {
    // S = max |want| (zero-mean random inputs).
    const ErrorModel model = mlp_chain(c, tp.size).model(DType::f32);
    const Tensor want = mlp_block(x, full, p);
    const Comparison err = compare(want, got, model);
    const double corr = pcc(want, got);
    const bool ok = err.passed && corr >= 0.99999;
    fmt::print(
        "MoE block expert parallel, mesh {}: max abs {:.2e}, error / bound {:.3g} (<= 1, {}), "
        "PCC {:.9f} {}\n",
        mesh.str(), max_abs_error(want, got), err.value, model.str(), corr, ok ? "PASS" : "FAIL");
    // Where everything lives: every device of an EP row holds the same tokens and experts.
    const Routing r = route_top_k(
        linear(rms_norm(x, full.norm_scale, p.norm_eps), full.gate_weight, full.gate_bias),
        c.experts_per_token);
    const std::vector<std::int64_t> slots = device_load(pl, expert_load(r, c.num_experts));
    for (int d = 0; d < ep.size; ++d) {
      const Range tok = split_range(kTokens, ep.size, d);
      const std::vector<std::int64_t>& ex = pl.experts_of[static_cast<std::size_t>(d)];
      fmt::print(
          "  EP device {} (mesh row {}, {} TP devices): tokens [{}, {}) ({}), experts {} ({}; "
          "each TP device holds {} of their {} units), routed slots it computes {}\n",
          d, d, tp.size, tok.start, tok.start + tok.size, tok.size,
          ex.empty() ? "none" : fmt::format("{}..{}", ex.front(), ex.back()), ex.size(),
          c.intermediate_size / tp.size, c.intermediate_size, slots[static_cast<std::size_t>(d)]);
    }
    const auto [want_capped, want_dropped] = capacity_reference(x, full, c);
    const Comparison cap_err = compare(want_capped, got_capped, model);
    const bool cap_ok = cap_err.passed && moe.dropped == want_dropped;
    fmt::print(
        "  capacity factor {}: capacity {} slots per expert, dropped {} of {} slots (one device: "
        "{}), max abs {:.2e}, error / bound {:.3g} {}\n",
        kCapacityFactor,
        expert_capacity(kTokens, c.experts_per_token, c.num_experts, kCapacityFactor), moe.dropped,
        kTokens * c.experts_per_token, want_dropped, max_abs_error(want_capped, got_capped),
        cap_err.value, cap_ok ? "PASS" : "FAIL");
    failed = (ok ? 0 : 1) + (cap_ok ? 0 : 1);
    fmt::print("  MoE EP check: {}; wall {:.1f} s\n", failed == 0 ? "PASS" : "FAIL",
               MPI_Wtime() - t0);
  }
  MESHTEST_MPI(MPI_Bcast(&failed, 1, MPI_INT, 0, mesh.comm()));
  return failed;
}

}  // namespace meshtest::dist
