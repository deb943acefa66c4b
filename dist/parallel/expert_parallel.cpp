// expert_parallel: expert placement, EP weight shards, and the expert-parallel MoE forward
// (side exchange, dispatch of one row per token and device, grouped GEMMs, the weighted sum of
// each row's pairs, TP sum, combine). The backward is in
// expert_parallel_grad.cpp; the shared routes in ep_routes.cpp.
#include "dist/parallel/expert_parallel.hpp"

#include <fmt/format.h>

#include <array>
#include <string>
#include <string_view>

#include "dist/ccl/all_reduce.hpp"
#include "dist/ccl/all_to_all.hpp"
#include "dist/mesh/agree.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "dist/parallel/ep_routes.hpp"
#include "src/ops/elementwise.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/rms_norm.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dist {
namespace {

using ep_detail::check_ep_tokens;
using ep_detail::check_ep_weights;

void check_tokens_rank(std::string_view op, const Tensor& x) {
  MESHTEST_DIST_CHECK(x.rank() == 2, "{}: the tokens have shape {}, expected [T_local, hidden]", op,
                      x.shape());
}

// The routed experts on checked inputs.
EpMoeResult moe_unchecked(const MeshDevice& mesh, const Tensor& t, const Routing& r,
                          const EpMlpWeights& w, const MoeParams& p, const EpOptions& o) {
  const ep_detail::Routes routes = ep_detail::plan_routes(mesh, r, w.placement, w.device, p, o);
  const Tensor rows =
      all_to_all_v(mesh, permute(t, routes.send), routes.send_counts, {.axis = o.ep_axis});
  const Tensor y =
      ep_detail::local_experts(mesh, permute(rows, routes.recv), routes.recv, w, p, o).y;
  // One row per received token: its pairs weighted and summed (a dropped pair adds nothing),
  // then summed over TP (linear in y, so the TP partials may be summed after the weights).
  Tensor combined = unpermute(y, routes.recv, routes.recv_weights);
  ep_detail::sum_over_tp(mesh, combined, o);
  const Tensor back = all_to_all_v(mesh, combined, routes.recv_counts, {.axis = o.ep_axis});
  return {.out = unpermute(back, routes.send,
                           ep_detail::ones(Shape{r.num_tokens, routes.send.k}, t.dtype())),
          .dropped = routes.dropped,
          .rows_sent = routes.send_counts,
          .rows_received = routes.recv_counts};
}

}  // namespace

ExpertPlacement place_experts(ExpertAssignment a, std::int64_t num_experts, int num_devices,
                              std::span<const std::int64_t> load) {
  if (a == ExpertAssignment::Contiguous) return contiguous_placement(num_experts, num_devices);
  MESHTEST_DIST_CHECK(a == ExpertAssignment::Balanced,
                      "place_experts: assignment {} is neither Contiguous nor Balanced",
                      static_cast<int>(a));
  MESHTEST_DIST_CHECK(static_cast<std::int64_t>(load.size()) == num_experts,
                      "place_experts: a balanced placement of {} experts needs their {} loads, "
                      "got {}",
                      num_experts, num_experts, load.size());
  return balanced_placement(load, num_devices);
}

std::vector<std::int64_t> global_expert_load(const MeshDevice& mesh, const Routing& r,
                                             std::int64_t num_experts, const EpOptions& o) {
  perf::OpScope scope("global_expert_load");
  ep_tp_axis(o);
  std::vector<std::int64_t> load;
  check_and_agree(mesh.comm(), "global_expert_load", [&] { load = expert_load(r, num_experts); });
  Tensor sum = Tensor::from_vector(Shape{num_experts}, load);
  all_reduce_inplace(mesh, sum, {.axis = o.ep_axis});
  const std::span<const std::int64_t> s = sum.span<std::int64_t>();
  return {s.begin(), s.end()};
}

EpMlpWeights shard_ep_mlp_weights(const WeightSource& src, const GptOssConfig& c,
                                  std::int64_t layer, const ExpertPlacement& placement,
                                  int ep_device, TpRank tp) {
  check_placement(placement);
  MESHTEST_DIST_CHECK(placement.num_experts == c.num_experts,
                      "expert parallel: the placement holds {} experts, the config {}",
                      placement.num_experts, c.num_experts);
  MESHTEST_DIST_CHECK(ep_device >= 0 && ep_device < placement.num_devices,
                      "expert parallel: EP device {} of a placement over {} devices", ep_device,
                      placement.num_devices);
  const std::vector<std::int64_t>& mine = placement.experts_of[static_cast<std::size_t>(ep_device)];
  const std::string pre = fmt::format("block.{}.mlp.", layer);
  const auto per_expert = [pre](const std::string& name) {
    const std::array<std::string_view, 4> names{"mlp1_weight", "mlp1_bias", "mlp2_weight",
                                                "mlp2_bias"};
    for (const std::string_view n : names) {
      if (name == pre + std::string(n)) return true;
    }
    return false;
  };
  // This device's experts of a per-expert tensor, each cut by `cut` (tp_shard's TP rule).
  const auto pick = [&](const std::string& name, const auto& cut) {
    if (mine.empty()) return cut(src.slice(name, 0, {0, 0}));
    std::vector<Tensor> parts;
    for (const std::int64_t e : mine) parts.push_back(cut(src.slice(name, 0, {e, 1})));
    return parts.size() == 1 ? std::move(parts[0]) : concat(parts, 0);
  };
  const WeightSource experts{
      .whole =
          [&](const std::string& name) {
            return per_expert(name) ? pick(name, [](Tensor t) { return t; }) : src.whole(name);
          },
      .slice =
          [&](const std::string& name, int dim, Range r) {
            return per_expert(name) ? pick(name, [&](const Tensor& t) { return t.slice(dim, r); })
                                    : src.slice(name, dim, r);
          }};
  return {
      .placement = placement, .device = ep_device, .mlp = shard_mlp_weights(experts, c, layer, tp)};
}

EpMoeResult ep_moe(const MeshDevice& mesh, const Tensor& t, const Routing& r, const EpMlpWeights& w,
                   const MoeParams& p, const EpOptions& o) {
  constexpr std::string_view op = "ep_moe";
  perf::OpScope scope(op);
  ep_tp_axis(o);
  check_and_agree(mesh.comm(), op, [&] {
    check_tokens_rank(op, t);
    check_ep_weights(op, mesh, w, p, o, t.shape()[1], t.dtype());
    check_ep_tokens(op, t.shape()[0], t.dtype(), r, w.placement.num_experts, p);
  });
  EpMoeResult result = moe_unchecked(mesh, t, r, w, p, o);
  scope.input(t).output(result.out).attr("k", r.k);
  return result;
}

Tensor ep_mlp_block(const MeshDevice& mesh, const Tensor& x, const EpMlpWeights& w,
                    const MoeParams& p, const EpOptions& o) {
  constexpr std::string_view op = "ep_mlp_block";
  perf::OpScope scope(op);
  ep_tp_axis(o);
  check_and_agree(mesh.comm(), op, [&] {
    check_tokens_rank(op, x);
    check_ep_weights(op, mesh, w, p, o, x.shape()[1], x.dtype());
  });
  const Tensor t = rms_norm(x, w.mlp.norm_scale, p.norm_eps);
  const Routing r = route_top_k(linear(t, w.mlp.gate_weight, w.mlp.gate_bias), p.experts_per_token);
  return add(x, moe_unchecked(mesh, t, r, w, p, o).out);
}

}  // namespace meshtest::dist
