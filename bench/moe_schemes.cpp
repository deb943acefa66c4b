// moe_schemes (bench/moe_schemes.hpp): random MLP weights by slice, the all_gather-everything
// MoE block, and the rows each scheme's exchanges move.
#include "bench/moe_schemes.hpp"

#include <cmath>
#include <string>

#include "dist/ccl/all_gather.hpp"
#include "dist/ccl/reduce_scatter.hpp"
#include "dist/parallel/ep_routes.hpp"
#include "src/core/random.hpp"
#include "src/ops/elementwise.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/moe/permute.hpp"
#include "src/ops/rms_norm.hpp"

namespace meshtest::bench {
namespace {

/// One generated weight: its global shape, its values' range and its random stream.
struct Drawn {
  Shape shape;
  Uniform range;
  std::uint64_t stream = 0;
};

Drawn drawn(const GptOssConfig& c, const std::string& name) {
  const std::int64_t h = c.hidden_size, e = c.num_experts, i = c.intermediate_size;
  const double gain_h = std::sqrt(3.0 / static_cast<double>(h));
  const double gain_i = std::sqrt(3.0 / static_cast<double>(i));
  const std::string pre = "block.0.mlp.";
  if (name == pre + "norm.scale") return {Shape{h}, {0.5, 1.5}, 1};
  if (name == pre + "gate.weight") return {Shape{e, h}, {-gain_h, gain_h}, 2};
  if (name == pre + "gate.bias") return {Shape{e}, {-0.1, 0.1}, 3};
  if (name == pre + "mlp1_weight") return {Shape{e, 2 * i, h}, {-gain_h, gain_h}, 4};
  if (name == pre + "mlp1_bias") return {Shape{e, 2 * i}, {-0.1, 0.1}, 5};
  if (name == pre + "mlp2_weight") return {Shape{e, h, i}, {-gain_i, gain_i}, 6};
  if (name == pre + "mlp2_bias") return {Shape{e, h}, {-0.1, 0.1}, 7};
  fail("random_mlp_source: no weight named '{}' (expected {}norm.scale, gate.*, mlp1_*, mlp2_*)",
       name, pre);
}

/// The slots of r whose expert lives on `device`, grouped by its experts (placement order),
/// slots ascending within one; every other slot is "dropped" (it adds nothing on unpermute).
Permutation local_slots(const Routing& r, const ExpertPlacement& pl, int device) {
  const std::vector<std::int64_t>& mine = pl.experts_of[static_cast<std::size_t>(device)];
  Permutation p{.num_tokens = r.num_tokens,
                .k = r.k,
                .num_experts = static_cast<std::int64_t>(mine.size()),
                .slots = {},
                .offsets = {0},
                .dropped = {}};
  for (const std::int64_t e : mine) {
    for (std::size_t s = 0; s < r.experts.size(); ++s) {
      if (r.experts[s] == e) p.slots.push_back(static_cast<std::int64_t>(s));
    }
    p.offsets.push_back(p.rows());
  }
  for (std::size_t s = 0; s < r.experts.size(); ++s) {
    if (pl.device_of[static_cast<std::size_t>(r.experts[s])] != device) {
      p.dropped.push_back(static_cast<std::int64_t>(s));
    }
  }
  return p;
}

}  // namespace

dist::WeightSource random_mlp_source(const GptOssConfig& c, std::uint64_t seed) {
  return {.whole =
              [c, seed](const std::string& name) {
                const Drawn d = drawn(c, name);
                return generate(d.shape, DType::f32, {.seed = seed, .stream = d.stream}, d.range);
              },
          .slice =
              [c, seed](const std::string& name, int dim, Range r) {
                const Drawn d = drawn(c, name);
                return generate_slice(d.shape, dim, r, DType::f32,
                                      {.seed = seed, .stream = d.stream}, d.range);
              }};
}

Tensor all_gather_mlp_block(const dist::MeshDevice& mesh, const Tensor& x,
                            const dist::EpMlpWeights& w, const MoeParams& p,
                            const dist::EpOptions& o) {
  const Tensor t = rms_norm(x, w.mlp.norm_scale, p.norm_eps);
  const Tensor all = dist::all_gather(mesh, t, {.dim = 0, .axis = o.ep_axis});
  const Routing r =
      route_top_k(linear(all, w.mlp.gate_weight, w.mlp.gate_bias), p.experts_per_token);
  const Permutation mine = local_slots(r, w.placement, w.device);
  const Tensor y = dist::ep_detail::local_experts(mesh, permute(all, mine), mine, w, p, o).y;
  const Tensor partial = unpermute(y, mine, r.weights);
  Tensor out = dist::reduce_scatter(mesh, partial, {.dim = 0, .axis = o.ep_axis});
  dist::ep_detail::sum_over_tp(mesh, out, o);
  return add(x, out);
}

std::vector<DeviceTraffic> ep_traffic(std::span<const std::int64_t> experts, std::int64_t k,
                                      const ExpertPlacement& placement) {
  MESHTEST_CHECK(k >= 1 && static_cast<std::int64_t>(experts.size()) % k == 0,
                 "ep_traffic: {} expert ids do not make tokens of k = {}", experts.size(), k);
  const int devices = placement.num_devices;
  const auto d_count = static_cast<std::size_t>(devices);
  const std::int64_t tokens = static_cast<std::int64_t>(experts.size()) / k;
  std::vector<DeviceTraffic> out(d_count);
  for (int d = 0; d < devices; ++d) {
    DeviceTraffic& dt = out[static_cast<std::size_t>(d)];
    dt.tokens = split_range(tokens, devices, d).size;
    dt.experts =
        static_cast<std::int64_t>(placement.experts_of[static_cast<std::size_t>(d)].size());
    dt.to.assign(d_count, 0);
    dt.from.assign(d_count, 0);
  }
  // pairs_to[o][d]: the slots of device o's tokens whose expert is on device d.
  std::vector<std::vector<std::int64_t>> pairs_to(d_count, std::vector<std::int64_t>(d_count, 0));
  std::vector<std::int64_t> on(d_count);
  int owner = -1;
  std::int64_t owner_end = 0;  // one past the last token of `owner`
  for (std::int64_t t = 0; t < tokens; ++t) {
    while (t >= owner_end) {
      const Range r = split_range(tokens, devices, ++owner);
      owner_end = r.start + r.size;
    }
    const auto src = static_cast<std::size_t>(owner);
    std::fill(on.begin(), on.end(), 0);
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t e = experts[static_cast<std::size_t>(t * k + j)];
      MESHTEST_CHECK(e >= 0 && e < placement.num_experts,
                     "ep_traffic: token {} goes to expert {}, expected [0, {})", t, e,
                     placement.num_experts);
      ++on[static_cast<std::size_t>(placement.device_of[static_cast<std::size_t>(e)])];
    }
    for (std::size_t dst = 0; dst < d_count; ++dst) {
      if (on[dst] == 0) continue;
      ++out[src].to[dst];  // the token once per device holding one of its experts
      ++out[dst].from[src];
      out[dst].pairs += on[dst];
      pairs_to[src][dst] += on[dst];
      if (dst == src) continue;
      ++out[src].min_rows;  // the row out, and its result back
      ++out[dst].min_rows;
    }
  }
  for (std::size_t d = 0; d < d_count; ++d) {
    DeviceTraffic& dt = out[d];
    dt.side_to.assign(d_count, 0);
    for (std::size_t o = 0; o < d_count; ++o) {
      dt.side_to[o] = dist::ep_detail::side_values(dt.to[o], pairs_to[d][o]);
      if (o == d) continue;
      dt.ep_rows += dt.to[o] + dt.from[o];
      dt.side_values += dt.side_to[o] + dist::ep_detail::side_values(dt.from[o], pairs_to[o][d]);
      dt.messages += (dt.to[o] > 0 ? 1 : 0) + (dt.from[o] > 0 ? 1 : 0);
    }
    dt.ag_rows = (devices - 1) * dt.tokens + tokens - dt.tokens;
  }
  return out;
}

}  // namespace meshtest::bench
