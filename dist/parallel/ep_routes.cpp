// ep_routes: the side exchange (each row's local experts and routing weights), the sender's and
// receiver's groupings with the capacity, the local experts' forward and the row helpers shared
// by the expert-parallel forward and backward.
#include "dist/parallel/ep_routes.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "dist/ccl/all_reduce.hpp"
#include "dist/ccl/all_to_all.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/ops/activations.hpp"
#include "src/ops/compute.hpp"
#include "src/ops/moe/balance.hpp"
#include "src/ops/moe/grouped_gemm.hpp"

namespace meshtest::dist::ep_detail {
namespace {

// Groups the slots of `keys` ([T·k], each in [0, buckets]) by key, slots ascending within one
// (make_permutation's counting sort); a slot keyed `buckets` has no row: it is listed in
// `dropped`, so it adds nothing on unpermute.
Permutation group_rows(std::vector<std::int64_t> keys, std::int64_t k, std::int64_t buckets) {
  const auto tokens = static_cast<std::int64_t>(keys.size()) / k;
  Permutation p = make_permutation(
      {.num_tokens = tokens, .k = k, .experts = std::move(keys), .weights = {}}, buckets + 1);
  const auto kept = static_cast<std::size_t>(p.offsets[static_cast<std::size_t>(buckets)]);
  p.dropped.assign(p.slots.begin() + static_cast<std::ptrdiff_t>(kept), p.slots.end());
  p.slots.resize(kept);
  p.offsets.pop_back();
  p.num_experts = buckets;
  return p;
}

// The sender's side lists, one segment per device (see plan_routes), and its rows' pairs.
std::vector<double> side_lists(const Routing& r, const ExpertPlacement& pl, Routes& routes,
                               std::vector<std::int64_t>& side_counts) {
  const std::int64_t k = r.k;
  const auto devices = static_cast<std::size_t>(pl.num_devices);
  std::vector<std::int64_t> local(static_cast<std::size_t>(pl.num_experts));
  for (const auto& mine : pl.experts_of) {
    for (std::size_t i = 0; i < mine.size(); ++i) local[mine[i]] = static_cast<std::int64_t>(i);
  }
  const Permutation& send = routes.send;
  routes.send_pairs.assign(static_cast<std::size_t>(send.rows() * k), -1);
  routes.send_counts.resize(devices);
  side_counts.resize(devices);
  std::vector<double> side;
  for (std::size_t d = 0; d < devices; ++d) {
    const std::size_t begin = side.size();
    const auto dev = static_cast<std::int64_t>(d);
    routes.send_counts[d] = send.count(dev);
    side.push_back(static_cast<double>(r.num_tokens));
    side.push_back(static_cast<double>(send.count(dev)));
    for (std::int64_t i = send.offsets[d]; i < send.offsets[d + 1]; ++i) {
      const std::int64_t t = send.slots[i] / send.k;
      const std::span<std::int64_t> pairs(routes.send_pairs.data() + i * k,
                                          static_cast<std::size_t>(k));
      std::size_t c = 0;
      for (std::int64_t s = t * k; s < (t + 1) * k; ++s) {
        if (pl.device_of[static_cast<std::size_t>(r.experts[s])] == dev) pairs[c++] = s;
      }
      side.push_back(static_cast<double>(c));
      for (std::size_t q = 0; q < c; ++q) {
        side.push_back(static_cast<double>(local[static_cast<std::size_t>(r.experts[pairs[q]])]));
      }
      for (std::size_t q = 0; q < c; ++q) side.push_back(r.weights.item(pairs[q]));
    }
    side_counts[d] = static_cast<std::int64_t>(side.size() - begin);
  }
  return side;
}

}  // namespace

std::int64_t side_values(std::int64_t rows, std::int64_t pairs) { return 2 + rows + 2 * pairs; }

Routes plan_routes(const MeshDevice& mesh, const Routing& r, const ExpertPlacement& pl, int device,
                   const MoeParams& p, const EpOptions& o) {
  const std::int64_t devices = pl.num_devices, k = r.k;
  // The sender: one row per token and device holding one of its experts.
  std::vector<std::int64_t> keys(static_cast<std::size_t>(r.num_tokens * devices), devices);
  for (std::int64_t s = 0; s < r.num_tokens * k; ++s) {
    const std::int64_t d = pl.device_of[static_cast<std::size_t>(r.experts[s])];
    keys[static_cast<std::size_t>(s / k * devices + d)] = d;
  }
  Routes routes;
  routes.send = group_rows(std::move(keys), devices, devices);
  std::vector<std::int64_t> side_counts;
  const std::vector<double> side = side_lists(r, pl, routes, side_counts);
  const Tensor got =
      all_to_all_v(mesh, Tensor::from_vector(Shape{static_cast<std::int64_t>(side.size())}, side),
                   side_counts, {.axis = o.ep_axis});
  // The receiver: rows by source device, then token (the global token order); their pairs.
  const std::span<const double> in = got.span<double>();
  const auto mine =
      static_cast<std::int64_t>(pl.experts_of[static_cast<std::size_t>(device)].size());
  std::vector<std::int64_t> expert_of_pair;  // [N·k]: local expert, `mine` past a row's pairs
  std::vector<double> weights;               // [N·k]: 0 past a row's pairs
  std::int64_t total_tokens = 0;
  std::size_t at = 0;
  routes.recv_counts.assign(static_cast<std::size_t>(devices), 0);
  for (std::size_t src = 0; src < static_cast<std::size_t>(devices); ++src) {
    total_tokens += static_cast<std::int64_t>(in[at]);
    const auto rows = static_cast<std::int64_t>(in[at + 1]);
    routes.recv_counts[src] = rows;
    at += 2;
    for (std::int64_t i = 0; i < rows; ++i) {
      const auto c = static_cast<std::size_t>(in[at++]);
      for (std::size_t q = 0; q < static_cast<std::size_t>(k); ++q) {
        expert_of_pair.push_back(q < c ? static_cast<std::int64_t>(in[at + q]) : mine);
        weights.push_back(q < c ? in[at + c + q] : 0.0);
      }
      at += 2 * c;
    }
  }
  const auto received = static_cast<std::int64_t>(expert_of_pair.size()) / k;
  routes.recv = group_rows(std::move(expert_of_pair), k, mine);
  routes.recv_weights = Tensor::from_vector(Shape{received, k}, weights).astype(r.weights.dtype());
  if (!o.capacity_factor) return routes;
  const std::int64_t capacity =
      expert_capacity(total_tokens, p.experts_per_token, pl.num_experts, *o.capacity_factor);
  const std::int64_t dropped =
      apply_capacity(routes.recv, capacity, o.drop_policy, &routes.recv_weights);
  Tensor total = Tensor::from_vector(Shape{1}, std::vector<std::int64_t>{dropped});
  all_reduce_inplace(mesh, total, {.axis = o.ep_axis});
  routes.dropped = total.span<std::int64_t>()[0];
  return routes;
}

ExpertActivations local_experts(const MeshDevice& mesh, const Tensor& x, const Permutation& recv,
                                const EpMlpWeights& w, const MoeParams& p, const EpOptions& o) {
  const MlpWeights& m = w.mlp;
  ExpertActivations acts;
  if (x.shape()[0] == 0) {  // no pairs kept here: nothing to compute
    acts.h = Tensor(Shape{0, m.mlp1_weight.shape()[1]}, x.dtype());
    acts.a = Tensor(Shape{0, m.mlp2_weight.shape()[2]}, x.dtype());
    acts.y = Tensor(Shape{0, x.shape()[1]}, x.dtype());
    return acts;
  }
  acts.h = grouped_gemm(x, recv.offsets, m.mlp1_weight, m.mlp1_bias);
  acts.a = swiglu(acts.h, p.swiglu_alpha, p.swiglu_limit);
  // TP device 0 adds the mlp2 bias in its GEMM, so it joins the TP sum once (as tp_mlp_block's
  // combine adds it once after the all_reduce).
  acts.y = grouped_gemm(acts.a, recv.offsets, m.mlp2_weight,
                        mesh.axis_index(ep_tp_axis(o)) == 0 ? m.mlp2_bias : Tensor{});
  return acts;
}

void sum_over_tp(const MeshDevice& mesh, Tensor& x, const EpOptions& o) {
  const int tp_axis = ep_tp_axis(o);
  if (mesh.axis_size(tp_axis) > 1) all_reduce_inplace(mesh, x, {.axis = tp_axis});
}

Tensor ones(Shape shape, DType dtype) {
  Tensor out(std::move(shape), dtype);
  out.fill(1.0);
  return out;
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

Tensor scatter_values(const Tensor& values, std::span<const std::int64_t> to, Shape shape) {
  MESHTEST_CHECK(values.numel() == static_cast<std::int64_t>(to.size()),
                 "scatter_values: {} values for {} destinations", values.numel(), to.size());
  const std::size_t size = dtype_size(values.dtype());
  Tensor out(std::move(shape), values.dtype());
  for (std::size_t i = 0; i < to.size(); ++i) {
    if (to[i] < 0) continue;
    std::memcpy(out.bytes() + static_cast<std::size_t>(to[i]) * size, values.bytes() + i * size,
                size);
  }
  return out;
}

void check_ep_layout(std::string_view op, const MeshDevice& mesh, const ExpertPlacement& pl,
                     int device, const MoeParams& p, const EpOptions& o) {
  const TpRank ep = ep_rank(mesh, o);
  check_placement(pl);
  MESHTEST_DIST_CHECK(pl.num_devices == ep.size,
                      "{}: the expert placement is over {} devices, but the EP axis {} of the {} "
                      "mesh has {}",
                      op, pl.num_devices, o.ep_axis, mesh.str(), ep.size);
  MESHTEST_DIST_CHECK(device == ep.index,
                      "{}: the weights are those of EP device {}, but this device is {} on the EP "
                      "axis {}",
                      op, device, ep.index, o.ep_axis);
  MESHTEST_DIST_CHECK(p.experts_per_token >= 1 && p.experts_per_token <= pl.num_experts,
                      "{}: experts_per_token is {}, expected 1 .. {} (the number of experts)", op,
                      p.experts_per_token, pl.num_experts);
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

void check_ep_weights(std::string_view op, const MeshDevice& mesh, const EpMlpWeights& w,
                      const MoeParams& p, const EpOptions& o, std::int64_t hidden, DType dtype) {
  const ExpertPlacement& pl = w.placement;
  check_ep_layout(op, mesh, pl, w.device, p, o);
  const std::int64_t experts = pl.num_experts;
  const auto local =
      static_cast<std::int64_t>(pl.experts_of[static_cast<std::size_t>(w.device)].size());
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
                      "{}: norm.scale has dtype {}, expected f32, f64, bf16 or f16", op,
                      m.norm_scale.dtype());
  const std::pair<const char*, const Tensor*> typed[] = {
      {"gate.weight", &m.gate_weight}, {"gate.bias", &m.gate_bias},
      {"mlp1_weight", &m.mlp1_weight}, {"mlp1_bias", &m.mlp1_bias},
      {"mlp2_weight", &m.mlp2_weight}, {"mlp2_bias", &m.mlp2_bias}};
  for (const auto& [name, t] : typed) meshtest::detail::check_dtype(op, name, *t, dtype);
}

void check_ep_tokens(std::string_view op, std::int64_t tokens, DType dtype, const Routing& r,
                     std::int64_t num_experts, const MoeParams& p) {
  MESHTEST_DIST_CHECK(r.num_tokens == tokens && r.k == p.experts_per_token &&
                          static_cast<std::int64_t>(r.experts.size()) == tokens * r.k,
                      "{}: the routing is for {} tokens x k {} ({} experts listed), expected {} "
                      "tokens x k {} (experts_per_token)",
                      op, r.num_tokens, r.k, r.experts.size(), tokens, p.experts_per_token);
  meshtest::detail::check_shape(op, "routing.weights", r.weights, Shape{tokens, r.k});
  meshtest::detail::check_dtype(op, "routing.weights", r.weights, dtype);
  for (std::size_t s = 0; s < r.experts.size(); ++s) {
    MESHTEST_DIST_CHECK(r.experts[s] >= 0 && r.experts[s] < num_experts,
                        "{}: the routing sends token {} to expert {}, expected [0, {})", op,
                        static_cast<std::int64_t>(s) / r.k, r.experts[s], num_experts);
  }
}

}  // namespace meshtest::dist::ep_detail
