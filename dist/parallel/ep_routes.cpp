// ep_routes: the counts exchange, the receiver's grouping with the capacity, the local experts'
// forward and the row helpers shared by the expert-parallel forward and backward.
#include "dist/parallel/ep_routes.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dist/ccl/all_reduce.hpp"
#include "dist/ccl/all_to_all.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/ops/activations.hpp"
#include "src/ops/compute.hpp"
#include "src/ops/grouped_gemm.hpp"
#include "src/ops/moe_balance.hpp"

namespace meshtest::dist::ep_detail {
Routes plan_routes(const MeshDevice& mesh, const Routing& r, const EpMlpWeights& w,
                   const MoeParams& p, const EpOptions& o) {
  const ExpertPlacement& pl = w.placement;
  const auto devices = static_cast<std::size_t>(pl.num_devices);
  // Each expert's position in placement order, and where each device's experts start.
  std::vector<std::int64_t> position(static_cast<std::size_t>(pl.num_experts));
  std::vector<std::int64_t> first(devices + 1, 0);
  std::size_t widest = 0;
  for (std::size_t d = 0; d < devices; ++d) {
    first[d + 1] = first[d];
    for (const std::int64_t e : pl.experts_of[d]) position[e] = first[d + 1]++;
    widest = std::max(widest, pl.experts_of[d].size());
  }
  Routing placed{.num_tokens = r.num_tokens, .k = r.k, .experts = r.experts, .weights = {}};
  for (std::int64_t& e : placed.experts) e = position[e];
  Routes routes;
  routes.send = make_permutation(placed, pl.num_experts);
  // To device d: T_local, then the rows of each of its experts (padded to the widest device).
  const std::size_t stride = widest + 1;
  std::vector<std::int64_t> message(devices * stride, 0);
  routes.send_counts.resize(devices);
  for (std::size_t d = 0; d < devices; ++d) {
    message[d * stride] = r.num_tokens;
    for (std::size_t i = 0; i < pl.experts_of[d].size(); ++i) {
      message[d * stride + 1 + i] = routes.send.count(first[d] + static_cast<std::int64_t>(i));
    }
    routes.send_counts[d] = routes.send.offsets[first[d + 1]] - routes.send.offsets[first[d]];
  }
  const Tensor got = all_to_all(
      mesh, Tensor::from_vector(Shape{static_cast<std::int64_t>(message.size())}, message),
      {.split_dim = 0, .concat_dim = 0, .axis = o.ep_axis});
  const std::span<const std::int64_t> in = got.span<std::int64_t>();
  // The rows arrive by source device, then by local expert: their experts, in that order.
  const std::size_t mine = pl.experts_of[static_cast<std::size_t>(w.device)].size();
  std::int64_t total_tokens = 0;
  std::vector<std::int64_t> expert_of_row;
  routes.recv_counts.assign(devices, 0);
  for (std::size_t s = 0; s < devices; ++s) {
    total_tokens += in[s * stride];
    for (std::size_t i = 0; i < mine; ++i) {
      const std::int64_t n = in[s * stride + 1 + i];
      routes.recv_counts[s] += n;
      expert_of_row.insert(expert_of_row.end(), static_cast<std::size_t>(n),
                           static_cast<std::int64_t>(i));
    }
  }
  routes.recv = permute_top1(expert_of_row, static_cast<std::int64_t>(mine));
  if (!o.capacity_factor) return routes;
  const std::int64_t capacity =
      expert_capacity(total_tokens, p.experts_per_token, pl.num_experts, *o.capacity_factor);
  Tensor weights;
  if (o.drop_policy == DropPolicy::LowestWeight) {
    weights = all_to_all_v(mesh, gather_slots(r.weights, routes.send), routes.send_counts,
                           {.axis = o.ep_axis});
  }
  const std::int64_t dropped =
      apply_capacity(routes.recv, capacity, o.drop_policy,
                     o.drop_policy == DropPolicy::LowestWeight ? &weights : nullptr);
  Tensor total = Tensor::from_vector(Shape{1}, std::vector<std::int64_t>{dropped});
  all_reduce_inplace(mesh, total, {.axis = o.ep_axis});
  routes.dropped = total.span<std::int64_t>()[0];
  return routes;
}

ExpertActivations local_experts(const MeshDevice& mesh, const Tensor& x, const Permutation& recv,
                                const EpMlpWeights& w, const MoeParams& p, const EpOptions& o) {
  const int tp_axis = ep_tp_axis(o);
  const MlpWeights& m = w.mlp;
  ExpertActivations acts;
  if (x.shape()[0] == 0) {  // no rows kept here: nothing to compute, but the TP sum still runs
    acts.h = Tensor(Shape{0, m.mlp1_weight.shape()[1]}, x.dtype());
    acts.a = Tensor(Shape{0, m.mlp2_weight.shape()[2]}, x.dtype());
    acts.y = Tensor(Shape{0, x.shape()[1]}, x.dtype());
  } else {
    acts.h = grouped_gemm(x, recv.offsets, m.mlp1_weight, m.mlp1_bias);
    acts.a = swiglu(acts.h, p.swiglu_alpha, p.swiglu_limit);
    // TP device 0 adds the mlp2 bias in its GEMM, so it joins the sum once (as tp_mlp_block's
    // combine adds it once after the all_reduce).
    acts.y = grouped_gemm(acts.a, recv.offsets, m.mlp2_weight,
                          mesh.axis_index(tp_axis) == 0 ? m.mlp2_bias : Tensor{});
  }
  if (mesh.axis_size(tp_axis) > 1) all_reduce_inplace(mesh, acts.y, {.axis = tp_axis});
  return acts;
}

Tensor to_receive_order(const Tensor& y, const Permutation& recv) {
  if (recv.num_tokens == 0) return Tensor(Shape{0, y.shape()[1]}, y.dtype());
  Tensor ones(Shape{recv.num_tokens, 1}, y.dtype());
  ones.fill(1.0);
  return unpermute(y, recv, ones);
}

Tensor gather_slots(const Tensor& values, const Permutation& p) {
  const std::size_t size = dtype_size(values.dtype());
  Tensor out(Shape{p.rows(), 1}, values.dtype(), Tensor::Uninitialized{});
  for (std::size_t i = 0; i < p.slots.size(); ++i) {
    std::memcpy(out.bytes() + i * size,
                values.bytes() + static_cast<std::size_t>(p.slots[i]) * size, size);
  }
  return out;
}

Tensor scatter_slots(const Tensor& column, const Permutation& p) {
  const std::size_t size = dtype_size(column.dtype());
  Tensor out(Shape{p.num_tokens, p.k}, column.dtype());
  for (std::size_t i = 0; i < p.slots.size(); ++i) {
    std::memcpy(out.bytes() + static_cast<std::size_t>(p.slots[i]) * size,
                column.bytes() + i * size, size);
  }
  return out;
}

void check_ep_weights(std::string_view op, const MeshDevice& mesh, const EpMlpWeights& w,
                      const MoeParams& p, const EpOptions& o, std::int64_t hidden, DType dtype) {
  const TpRank ep = ep_rank(mesh, o);
  const ExpertPlacement& pl = w.placement;
  check_placement(pl);
  MESHTEST_DIST_CHECK(pl.num_devices == ep.size,
                      "{}: the expert placement is over {} devices, but the EP axis {} of the {} "
                      "mesh has {}",
                      op, pl.num_devices, o.ep_axis, mesh.str(), ep.size);
  MESHTEST_DIST_CHECK(w.device == ep.index,
                      "{}: the weights are those of EP device {}, but this device is {} on the EP "
                      "axis {}",
                      op, w.device, ep.index, o.ep_axis);
  const std::int64_t experts = pl.num_experts;
  const auto local =
      static_cast<std::int64_t>(pl.experts_of[static_cast<std::size_t>(w.device)].size());
  MESHTEST_DIST_CHECK(p.experts_per_token >= 1 && p.experts_per_token <= experts,
                      "{}: experts_per_token is {}, expected 1 .. {} (the number of experts)", op,
                      p.experts_per_token, experts);
  const MlpWeights& m = w.mlp;
  meshtest::detail::check_rank(op, "mlp2_weight ([E_local, hidden, I/tp])", m.mlp2_weight, 3);
  const std::int64_t inter = m.mlp2_weight.shape()[2];
  meshtest::detail::check_shape(op, "norm.scale", m.norm_scale, Shape{hidden});
  meshtest::detail::check_shape(op, "gate.weight", m.gate_weight, Shape{experts, hidden});
  meshtest::detail::check_shape(op, "gate.bias", m.gate_bias, Shape{experts});
  meshtest::detail::check_shape(op, "mlp1_weight", m.mlp1_weight, Shape{local, 2 * inter, hidden});
  meshtest::detail::check_shape(op, "mlp1_bias", m.mlp1_bias, Shape{local, 2 * inter});
  meshtest::detail::check_shape(op, "mlp2_weight", m.mlp2_weight, Shape{local, hidden, inter});
  meshtest::detail::check_shape(op, "mlp2_bias", m.mlp2_bias, Shape{local, hidden});
  MESHTEST_DIST_CHECK(is_floating(m.norm_scale.dtype()),
                      "{}: norm.scale has dtype {}, expected f32, f64 or bf16", op,
                      m.norm_scale.dtype());
  const std::pair<const char*, const Tensor*> typed[] = {
      {"gate.weight", &m.gate_weight}, {"gate.bias", &m.gate_bias},
      {"mlp1_weight", &m.mlp1_weight}, {"mlp1_bias", &m.mlp1_bias},
      {"mlp2_weight", &m.mlp2_weight}, {"mlp2_bias", &m.mlp2_bias}};
  for (const auto& [name, t] : typed) meshtest::detail::check_dtype(op, name, *t, dtype);
  if (o.capacity_factor) {
    MESHTEST_DIST_CHECK(std::isfinite(*o.capacity_factor) && *o.capacity_factor >= 0,
                        "{}: capacity factor is {}, expected a finite factor >= 0 (or none)", op,
                        *o.capacity_factor);
  }
  MESHTEST_DIST_CHECK(
      o.drop_policy == DropPolicy::TokenOrder || o.drop_policy == DropPolicy::LowestWeight,
      "{}: drop policy {} is neither TokenOrder nor LowestWeight", op,
      static_cast<int>(o.drop_policy));
}

void check_ep_tokens(std::string_view op, const Tensor& t, const Routing& r,
                     std::int64_t num_experts, const MoeParams& p) {
  const std::int64_t tokens = t.shape()[0];
  MESHTEST_DIST_CHECK(r.num_tokens == tokens && r.k == p.experts_per_token &&
                          static_cast<std::int64_t>(r.experts.size()) == tokens * r.k,
                      "{}: the routing is for {} tokens x k {} ({} experts listed), expected {} "
                      "tokens x k {} (experts_per_token)",
                      op, r.num_tokens, r.k, r.experts.size(), tokens, p.experts_per_token);
  meshtest::detail::check_shape(op, "routing.weights", r.weights, Shape{tokens, r.k});
  meshtest::detail::check_dtype(op, "routing.weights", r.weights, t.dtype());
  for (std::size_t s = 0; s < r.experts.size(); ++s) {
    MESHTEST_DIST_CHECK(r.experts[s] >= 0 && r.experts[s] < num_experts,
                        "{}: the routing sends token {} to expert {}, expected [0, {})", op,
                        static_cast<std::int64_t>(s) / r.k, r.experts[s], num_experts);
  }
}

}  // namespace meshtest::dist::ep_detail
