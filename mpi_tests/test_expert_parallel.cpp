// test_expert_parallel: the expert-parallel MoE block (dist/parallel/expert_parallel), forward
// and backward, against the single-device mlp_block / moe_backward on the whole input, on the
// meshes of the world size (ep_test::ep_meshes: 1 x N with EP over all devices; R x C with EP on
// axis 0 and TP on axis 1 and the reverse, 4x8 at np 32). Each device compares its own tokens'
// rows and its experts' TP slices of the weight grads within the error model of the same
// computation in another order (src/check/tolerance.hpp; ep_test::chain_terms). The capacity's
// dropped slots come from a plain loop in the test (ep_test::dropped_slots); the reference zeroes
// their routing weights. The rows the dispatch sends (one per token and distinct device holding one
// of its experts) are counted in the test from the routing and the placement.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "dist/parallel/expert_parallel.hpp"
#include "dist/testing/harness/harness.hpp"
#include "mpi_tests/support/ep_moe.hpp"
#include "src/ops/elementwise.hpp"
#include "src/perf/profiler.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::dist {
namespace {

using ep_test::EpCase;
using ep_test::EpMesh;
using ep_test::expect_close;
using ep_test::expert_slice;
using ep_test::local_routing;
using ep_test::Problem;
using test_support::expect_error;

class ExpertParallel : public ::testing::TestWithParam<EpMesh> {
 protected:
  void SetUp() override { mesh_.emplace(std::vector<int>{GetParam().rows, GetParam().cols}); }
  void TearDown() override { mesh_.reset(); }
  const MeshDevice& mesh() const { return *mesh_; }
  EpOptions options(const EpCase& c = {}) const {
    return {.ep_axis = GetParam().ep_axis, .capacity_factor = c.capacity, .drop_policy = c.policy};
  }

  /// The problem of a case, this device's EP weights and tokens.
  struct Setup {
    Problem pb;
    TpRank ep;
    TpRank tp;
    ExpertPlacement placement;
    EpMlpWeights w;
    Range mine;  ///< this device's tokens
    std::string label;
  };
  Setup setup(const EpCase& c) const {
    const EpOptions o = options(c);
    Setup s;
    s.ep = ep_rank(mesh(), o);
    s.tp = ep_tp_rank(mesh(), o);
    s.pb = ep_test::make_problem(c, s.tp.size);
    s.placement = place_experts(c.assignment, c.experts, s.ep.size, s.pb.load);
    s.w = shard_ep_mlp_weights(weight_source(BlockWeights{.attn = {}, .mlp = s.pb.full}, 0),
                               s.pb.config, 0, s.placement, s.ep.index, s.tp);
    s.mine = split_range(c.tokens, s.ep.size, s.ep.index);
    s.label = fmt::format("{} {} {} mesh {} ep_axis {}", c.name, dtype_name(c.dtype),
                          c.assignment == ExpertAssignment::Balanced ? "balanced" : "contiguous",
                          mesh().str(), o.ep_axis);
    return s;
  }

  /// ep_mlp_block against the single-device block; with a capacity also ep_moe and its count
  /// of dropped slots.
  void check_forward(const EpCase& c) const {
    const Setup s = setup(c);
    const EpOptions o = options(c);
    const MoeParams p = s.pb.config.moe_params();
    const Tensor want = ep_test::reference_block(s.pb, c.capacity.has_value()).slice(0, s.mine);
    const Tensor x = s.pb.x.slice(0, s.mine);
    const std::int64_t n = ep_test::chain_terms(s.pb, s.tp.size).block;
    expect_close(ep_mlp_block(mesh(), x, s.w, p, o), want, n, s.label + " block");
    if (!c.capacity) return;
    const EpMoeResult moe =
        ep_moe(mesh(), s.pb.t.slice(0, s.mine), local_routing(s.pb.r, s.mine), s.w, p, o);
    expect_close(add(x, moe.out), want, n, s.label + " ep_moe");
    EXPECT_EQ(moe.dropped, ep_test::count_dropped(s.pb)) << s.label;
  }

  /// ep_moe_backward against the rows and slices of the single-device moe_backward.
  void check_backward(const EpCase& c) const {
    const Setup s = setup(c);
    const MoeGrads want = ep_test::reference_grads(s.pb);
    const MoeGrads got =
        ep_moe_backward(mesh(), s.pb.t.slice(0, s.mine), local_routing(s.pb.r, s.mine), s.w,
                        s.pb.grad_out.slice(0, s.mine), s.pb.config.moe_params(), options(c));
    const std::vector<std::int64_t>& mine =
        s.placement.experts_of[static_cast<std::size_t>(s.ep.index)];
    const std::int64_t ip = s.pb.config.intermediate_size / s.tp.size;
    const Range units{2 * s.tp.index * ip, 2 * ip};
    const ep_test::ChainTerms n = ep_test::chain_terms(s.pb, s.tp.size);
    expect_close(got.t, want.t.slice(0, s.mine), n.grad_t, s.label + " grad t");
    expect_close(got.weights, want.weights.slice(0, s.mine), n.grad_weights,
                 s.label + " grad weights", ep_test::grad_weights_scale(s.pb).slice(0, s.mine));
    expect_close(got.mlp1_weight, expert_slice(want.mlp1_weight, mine, 1, units), n.grad_mlp1,
                 s.label + " grad mlp1_weight");
    expect_close(got.mlp1_bias, expert_slice(want.mlp1_bias, mine, 1, units), n.grad_mlp1,
                 s.label + " grad mlp1_bias");
    expect_close(got.mlp2_weight, expert_slice(want.mlp2_weight, mine, 2, {s.tp.index * ip, ip}),
                 n.grad_mlp2_weight, s.label + " grad mlp2_weight");
    expect_close(got.mlp2_bias, expert_slice(want.mlp2_bias, mine), n.grad_mlp2_bias,
                 s.label + " grad mlp2_bias");
  }

  void check_both(const EpCase& c) const {
    check_forward(c);
    check_backward(c);
  }

 private:
  std::optional<MeshDevice> mesh_;
};

TEST_P(ExpertParallel, ForwardAndBackwardMatchSingleDevice) {
  // 11 tokens, 5 experts top-2 (5 does not divide EP sizes 2, 3, 4, 8: uneven, some devices
  // without experts from 6 up), random weights, both placements and dtypes.
  for (const DType dtype : {DType::f32, DType::f64}) {
    for (const ExpertAssignment a : {ExpertAssignment::Contiguous, ExpertAssignment::Balanced}) {
      check_both({.name = "random", .dtype = dtype, .assignment = a});
    }
  }
}

TEST_P(ExpertParallel, CapacityDropsAsTheSingleDevice) {
  const std::vector<EpCase> cases{
      {.name = "capacity 1.0", .tokens = 13, .capacity = 1.0},
      {.name = "capacity 1.0 balanced",
       .tokens = 13,
       .assignment = ExpertAssignment::Balanced,
       .capacity = 1.0},
      // Every token's first choice is expert 3: most of its slots are dropped.
      {.name = "skewed capacity 0.5", .capacity = 0.5, .only_expert = 3},
      // Random routing: the lowest weights are not the last tokens (checked below).
      {.name = "capacity 0.5 lowest weight",
       .tokens = 13,
       .capacity = 0.5,
       .policy = DropPolicy::LowestWeight},
      {.name = "skewed capacity 0.5 f32", .dtype = DType::f32, .capacity = 0.5, .only_expert = 1},
      {.name = "capacity 0: all dropped", .capacity = 0.0},
  };
  for (const EpCase& c : cases) {
    const Problem pb = ep_test::make_problem(c, 1);
    if (c.only_expert >= 0 || *c.capacity == 0.0) {
      EXPECT_GT(ep_test::count_dropped(pb), 0) << c.name;
    }
    if (c.policy == DropPolicy::LowestWeight) {  // the policies drop different slots here
      EXPECT_NE(pb.dropped,
                ep_test::dropped_slots(pb.r, c.experts, *c.capacity, DropPolicy::TokenOrder));
    }
    check_both(c);
  }
}

TEST_P(ExpertParallel, EdgeCases) {
  const int ep = ep_rank(mesh(), options()).size;
  const std::vector<EpCase> cases{
      {.name = "no tokens", .tokens = 0},
      {.name = "fewer tokens than EP devices", .tokens = 2, .experts = 4},
      {.name = "one token", .tokens = 1, .experts = 4},
      {.name = "every token to one expert k=1",
       .tokens = 9,
       .experts = 4,
       .k = 1,
       .only_expert = 3},
      {.name = "every token to one expert k=2 balanced",
       .tokens = 9,
       .experts = 4,
       .assignment = ExpertAssignment::Balanced,
       .only_expert = 2},
      {.name = "two experts (devices without experts)", .tokens = 6, .experts = 2, .k = 1},
      {.name = "one expert", .tokens = 5, .experts = 1, .k = 1},
      {.name = "k = E", .tokens = 5, .experts = 3, .k = 3},
      {.name = "k = 1", .tokens = 9, .experts = 6, .k = 1},
      {.name = "E = 7 top-3 balanced",
       .tokens = 10,
       .experts = 7,
       .k = 3,
       .assignment = ExpertAssignment::Balanced},
  };
  for (const EpCase& c : cases) check_both(c);
  // Devices with no experts (E = 2 < EP size) exist from 3 EP devices up.
  const ExpertPlacement two = place_experts(ExpertAssignment::Contiguous, 2, ep);
  EXPECT_EQ(std::count_if(two.experts_of.begin(), two.experts_of.end(),
                          [](const auto& v) { return v.empty(); }),
            std::max(0, ep - 2));
}

TEST_P(ExpertParallel, Hidden8192TwoTokens) {
  // Two experts, both chosen (k = E), one intermediate unit per TP device: the full weights
  // every device builds for the reference stay small at TP 8.
  check_both({.name = "hidden 8192",
              .tokens = 2,
              .experts = 2,
              .k = 2,
              .hidden = 8192,
              .units_per_tp = 1,
              .dtype = DType::f32});
}

TEST_P(ExpertParallel, DispatchSendsOneRowPerTokenAndDevice) {
  // The dispatch sends a token once to every EP device holding one of its experts, not once
  // per slot: with k = E a token goes to min(D, E) devices where a per-slot dispatch sent it k
  // times. The rows counted here (from the routing and the placement) include the token's own
  // device, a local copy inside the exchange (the bench's minimum, bytes on the wire, leaves it
  // out). The CCL records show that the forward and the backward exchanges carried exactly
  // those rows, and side lists of 2 + rows + 2 · pairs values per device (the header's layout).
  const std::vector<EpCase> cases{
      {.name = "random"},
      {.name = "k = E", .tokens = 7, .experts = 5, .k = 5},
      {.name = "E 8 top-4 balanced",
       .tokens = 13,
       .experts = 8,
       .k = 4,
       .assignment = ExpertAssignment::Balanced},
      {.name = "capacity 0.5 (drops do not change the rows)", .tokens = 13, .capacity = 0.5},
      {.name = "no tokens", .tokens = 0},
  };
  for (const EpCase& c : cases) {
    const Setup s = setup(c);
    const auto devices = static_cast<std::size_t>(s.ep.size);
    const auto me = static_cast<std::size_t>(s.ep.index);
    std::vector<std::int64_t> sent(devices, 0), received(devices, 0), pairs(devices, 0);
    for (int src = 0; src < s.ep.size; ++src) {
      const auto owner = static_cast<std::size_t>(src);
      const Range tokens = split_range(c.tokens, s.ep.size, src);
      for (std::int64_t t = tokens.start; t < tokens.start + tokens.size; ++t) {
        std::vector<std::int64_t> slots_on(devices, 0);
        for (std::int64_t j = 0; j < c.k; ++j) {
          ++slots_on[static_cast<std::size_t>(
              s.placement.device_of[static_cast<std::size_t>(s.pb.r.experts[t * c.k + j])])];
        }
        for (std::size_t d = 0; d < devices; ++d) {
          if (slots_on[d] == 0) continue;
          if (owner == me) ++sent[d], pairs[d] += slots_on[d];
          if (d == me) ++received[owner];
        }
      }
    }
    const Routing r = local_routing(s.pb.r, s.mine);
    const Tensor t = s.pb.t.slice(0, s.mine), g = s.pb.grad_out.slice(0, s.mine);
    const MoeParams p = s.pb.config.moe_params();
    std::vector<perf::OpRecord> recs;
    EpMoeResult moe;
    {
      const perf::Session session;
      moe = ep_moe(mesh(), t, r, s.w, p, options(c));
      ep_moe_backward(mesh(), t, r, s.w, g, p, options(c));
      recs = perf::records();
    }
    EXPECT_EQ(moe.rows_sent, sent) << s.label;
    EXPECT_EQ(moe.rows_received, received) << s.label;
    std::int64_t side = 0;
    for (std::size_t d = 0; d < devices; ++d) side += 2 + sent[d] + 2 * pairs[d];
    const std::int64_t out = std::accumulate(sent.begin(), sent.end(), std::int64_t{0});
    const std::int64_t in = std::accumulate(received.begin(), received.end(), std::int64_t{0});
    // Per call: the side lists, the dispatch, the combine (inputs' rows), forward then backward.
    const std::vector<std::int64_t> want{side, out, in, side, out, in};
    std::vector<std::int64_t> got;
    for (const perf::OpRecord& rec : recs) {
      if (rec.op_code == "all_to_all_v" && !rec.inputs.empty()) {
        got.push_back(rec.inputs[0].shape[0]);
      }
    }
    EXPECT_EQ(got, want) << s.label;
    if (c.k == c.experts) {  // every device holding experts gets each token once
      EXPECT_EQ(out, r.num_tokens * std::min<std::int64_t>(s.ep.size, c.experts)) << s.label;
    }
  }
}

TEST_P(ExpertParallel, ShardsHoldTheirExpertsAndTheGlobalLoadBalances) {
  const EpCase c{.name = "shard", .tokens = 13, .experts = 7, .k = 2};
  for (const ExpertAssignment a : {ExpertAssignment::Contiguous, ExpertAssignment::Balanced}) {
    EpCase ca = c;
    ca.assignment = a;
    const Setup s = setup(ca);
    const std::vector<std::int64_t>& mine =
        s.placement.experts_of[static_cast<std::size_t>(s.ep.index)];
    const std::int64_t ip = s.pb.config.intermediate_size / s.tp.size;
    const MlpWeights& f = s.pb.full;
    EXPECT_TRUE(s.w.mlp.gate_weight.bitwise_equal(f.gate_weight));
    EXPECT_TRUE(s.w.mlp.norm_scale.bitwise_equal(f.norm_scale));
    EXPECT_TRUE(s.w.mlp.mlp1_weight.bitwise_equal(
        expert_slice(f.mlp1_weight, mine, 1, {2 * s.tp.index * ip, 2 * ip})));
    EXPECT_TRUE(s.w.mlp.mlp2_weight.bitwise_equal(
        expert_slice(f.mlp2_weight, mine, 2, {s.tp.index * ip, ip})));
    EXPECT_TRUE(s.w.mlp.mlp2_bias.bitwise_equal(expert_slice(f.mlp2_bias, mine)));
  }
  // The load summed over the EP axis equals the whole routing's (counted in the test).
  const Setup s = setup(c);
  EXPECT_EQ(global_expert_load(mesh(), local_routing(s.pb.r, s.mine), c.experts, options()),
            s.pb.load);
  EXPECT_EQ(ep_activation_placements(options())[static_cast<std::size_t>(GetParam().ep_axis)],
            Placement{Shard{0}});
}

TEST_P(ExpertParallel, BadInputThrowsTheSameErrorOnEveryDevice) {
  const EpCase c{.name = "bad", .tokens = 6, .experts = 4, .k = 2};
  const Setup s = setup(c);
  const MoeParams p = s.pb.config.moe_params();
  const EpOptions o = options();
  const Tensor x = s.pb.x.slice(0, s.mine), t = s.pb.t.slice(0, s.mine);
  const Tensor g = s.pb.grad_out.slice(0, s.mine);
  const Routing r = local_routing(s.pb.r, s.mine);
  const bool first = mesh().device_id() == 0;
  const std::string dev0 = fmt::format("device 0 of {} rejected its input", mesh().size());
  // A bad ep_axis: an argument error, thrown before any communication.
  for (const int axis : {-1, 2}) {
    expect_error([&] { ep_mlp_block(mesh(), x, s.w, p, {.ep_axis = axis}); },
                 {fmt::format("ep_axis is {}, expected 0 or 1", axis)});
  }
  // A negative capacity factor (everywhere).
  expect_error(
      [&] { ep_mlp_block(mesh(), x, s.w, p, {.ep_axis = o.ep_axis, .capacity_factor = -1}); },
      {dev0, "capacity factor is -1"});
  // Device 0's assignment misses expert 1 (placed nowhere).
  EpMlpWeights missing = s.w;
  if (first) {
    for (auto& v : missing.placement.experts_of) std::erase(v, 1);
  }
  expect_error([&] { ep_mlp_block(mesh(), x, missing, p, o); }, {dev0, "expert 1"});
  expect_error(
      [&] {
        place_experts(ExpertAssignment::Balanced, 4, 2, std::vector<std::int64_t>{1, 2});
      },
      {"needs their 4 loads, got 2"});
  // Routing and weight shapes that disagree, on device 0 only.
  Routing bad_k = r;
  if (first) bad_k.k = 3;
  expect_error([&] { ep_moe(mesh(), t, bad_k, s.w, p, o); }, {dev0, "routing is for"});
  Routing bad_id = r;
  if (first) bad_id.experts[0] = 9;  // device 0 always holds tokens
  expect_error([&] { ep_moe_backward(mesh(), t, bad_id, s.w, g, p, o); },
               {dev0, "token 0 to expert 9, expected [0, 4)"});
  Routing bad_weights = r;
  if (first) bad_weights.weights = Tensor(Shape{1, 3}, DType::f64);
  expect_error([&] { ep_moe(mesh(), t, bad_weights, s.w, p, o); }, {dev0, "routing.weights"});
  EpMlpWeights bad_w = s.w;
  if (first) bad_w.mlp.mlp1_weight = Tensor(Shape{1, 2, 3}, DType::f64);
  expect_error([&] { ep_mlp_block(mesh(), x, bad_w, p, o); }, {dev0, "mlp1_weight"});
  const Tensor bad_g = first ? Tensor(Shape{1, 1}, DType::f64) : g;
  expect_error([&] { ep_moe_backward(mesh(), t, r, s.w, bad_g, p, o); }, {dev0, "grad_out"});
  MoeParams big_k = p;
  big_k.experts_per_token = 5;
  expect_error([&] { ep_mlp_block(mesh(), x, s.w, big_k, o); }, {dev0, "experts_per_token is 5"});
  // bf16 has no backward; weights of another EP device.
  expect_error([&] { ep_moe_backward(mesh(), t.astype(DType::bf16), r, s.w, g, p, o); },
               {dev0, "not supported"});
  if (s.ep.size > 1) {
    EpMlpWeights other = s.w;
    other.device = (s.ep.index + 1) % s.ep.size;
    expect_error([&] { ep_mlp_block(mesh(), x, other, p, o); }, {dev0, "EP device"});
  }
  expect_error(
      [&] {
        shard_ep_mlp_weights(weight_source(BlockWeights{.attn = {}, .mlp = s.pb.full}, 0),
                             s.pb.config, 0, s.placement, s.ep.size, s.tp);
      },
      {fmt::format("EP device {} of a placement over {} devices", s.ep.size, s.ep.size)});
}

INSTANTIATE_TEST_SUITE_P(Mesh, ExpertParallel,
                         ::testing::ValuesIn(ep_test::ep_meshes(testing::world_size())),
                         [](const ::testing::TestParamInfo<EpMesh>& info) {
                           return fmt::format("{}x{}_ep{}", info.param.rows, info.param.cols,
                                              info.param.ep_axis);
                         });

}  // namespace
}  // namespace meshtest::dist
