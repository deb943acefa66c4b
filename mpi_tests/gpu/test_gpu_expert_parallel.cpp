// Expert parallelism on GPU ranks (dist/gpu/parallel/ep_moe.hpp) against the single-device CPU
// reference on the whole input (mpi_tests/support/ep_moe.hpp: the problem, the references, the
// capacity rule as a plain loop, the terms of the error model) and against the CPU ranks' EP path
// on the same routing, on the meshes of the world (ep_test::ep_meshes: 1 x N with EP over every
// device; at 4 the 2x2 mesh with EP on either axis and TP on the other; N x 1 and 1 x N at a prime
// N): f32 forward and backward within the model, bf16 forward against f32, the routes, counts and
// dropped slots the CPU ranks' bit for bit, the rows sent counted here from the routing, the
// capacity and its drop policies, the CPU tests' edge cases, the routing rule of the GPU router,
// and bad input (the same Error on every device).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "dist/gpu/parallel/ep_moe.hpp"
#include "dist/testing/gpu/gpu_test.hpp"
#include "mpi_tests/gpu/gpu_terms.hpp"
#include "mpi_tests/support/ep_moe.hpp"
#include "src/gpu/linear.hpp"
#include "src/gpu/moe.hpp"
#include "src/gpu/rms_norm.hpp"
#include "src/ops/moe/experts.hpp"
#include "tests/support/routing_flips.hpp"

namespace meshtest::dist {
namespace {

namespace mg = meshtest::gpu;
using ep_test::EpCase;
using ep_test::EpMesh;
using ep_test::expect_close;
using ep_test::expert_slice;
using ep_test::local_routing;
using ep_test::Problem;

/// A case on one mesh: the problem, this device's weights (host and GPU) and tokens.
struct EpSetup {
  Problem pb;
  EpOptions o;
  TpRank ep, tp;
  ExpertPlacement placement;
  EpMlpWeights host;
  GpuEpMlpWeights dev;
  Range mine;
  std::string label;
};

EpSetup setup(const MeshDevice& mesh, const EpMesh& m, const EpCase& c) {
  EpSetup s;
  s.o = {.ep_axis = m.ep_axis, .capacity_factor = c.capacity, .drop_policy = c.policy};
  s.ep = ep_rank(mesh, s.o);
  s.tp = ep_tp_rank(mesh, s.o);
  s.pb = ep_test::make_problem(c, s.tp.size);
  s.placement = place_experts(c.assignment, c.experts, s.ep.size, s.pb.load);
  s.host = shard_ep_mlp_weights(weight_source(BlockWeights{.attn = {}, .mlp = s.pb.full}, 0),
                                s.pb.config, 0, s.placement, s.ep.index, s.tp);
  s.dev = to_gpu(s.host);
  s.mine = split_range(c.tokens, s.ep.size, s.ep.index);
  s.label =
      fmt::format("{} {} mesh {} ep_axis {}", c.name, dtype_name(c.dtype), mesh.str(), m.ep_axis);
  return s;
}

/// f(mesh, m) on every EP mesh of the world, each made once for the process.
void for_each_ep_mesh(const std::function<void(const MeshDevice&, const EpMesh&)>& f) {
  for (const EpMesh& m : ep_test::ep_meshes(testing::world_size())) {
    const MeshDevice& mesh = gpu::mesh_of(m.rows, m.cols);
    SCOPED_TRACE(fmt::format("mesh {} ep_axis {}", mesh.str(), m.ep_axis));
    f(mesh, m);
  }
}

DeviceTensor on_gpu(const Tensor& t) { return DeviceTensor::from_host(t); }

/// The rows this device's dispatch sends to each EP device: one per local token and distinct
/// device holding one of its experts (counted from the routing and the placement).
std::vector<std::int64_t> rows_sent(const Routing& r, const ExpertPlacement& pl) {
  std::vector<std::int64_t> rows(static_cast<std::size_t>(pl.num_devices), 0);
  for (std::int64_t t = 0; t < r.num_tokens; ++t) {
    std::vector<bool> to(rows.size(), false);
    for (std::int64_t j = 0; j < r.k; ++j) {
      to[static_cast<std::size_t>(pl.device_of[static_cast<std::size_t>(r.experts[t * r.k + j])])] =
          true;
    }
    for (std::size_t d = 0; d < to.size(); ++d) rows[d] += to[d] ? 1 : 0;
  }
  return rows;
}

/// ep_moe from the reference's routing against the single-device block and the CPU ranks' EP
/// path; without a capacity, ep_mlp_block (the GPU's own router) under the routing rule.
void check_forward(const MeshDevice& mesh, const EpMesh& m, const EpCase& c) {
  const EpSetup s = setup(mesh, m, c);
  SCOPED_TRACE(s.label);
  const MoeParams p = s.pb.config.moe_params();
  const Tensor want = ep_test::reference_block(s.pb, c.capacity.has_value()).slice(0, s.mine);
  const Tensor x = s.pb.x.slice(0, s.mine), t = s.pb.t.slice(0, s.mine);
  const Routing r = local_routing(s.pb.r, s.mine);
  const std::int64_t n = ep_test::chain_terms(s.pb, s.tp.size).block;
  mg::Blas blas;
  const GpuEpMoeResult got = ep_moe(mesh, blas, on_gpu(t), r, s.dev, p, s.o);
  expect_close(add(x, got.out.to_host()), want, n, s.label + " ep_moe");
  const EpMoeResult cpu = ep_moe(mesh, t, r, s.host, p, s.o);
  EXPECT_EQ(got.rows_sent, cpu.rows_sent);
  EXPECT_EQ(got.rows_received, cpu.rows_received);
  EXPECT_EQ(got.dropped, cpu.dropped);
  EXPECT_EQ(got.rows_sent, rows_sent(r, s.placement));
  if (c.capacity) {
    EXPECT_EQ(got.dropped, ep_test::count_dropped(s.pb));
    return;
  }
  // The GPU's router on the same tokens (its ops, as ep_mlp_block runs them): a token whose
  // experts differ must be a near-tie of the CPU logits; it is left out, and counted.
  const Tensor block = ep_mlp_block(mesh, blas, on_gpu(x), s.dev, p, s.o).to_host();
  const DeviceTensor gt = mg::rms_norm(on_gpu(x), s.dev.norm_scale, blas.stream(), p.norm_eps);
  const Routing gpu_r =
      mg::gate(mg::linear(blas, gt, s.dev.gate_weight, s.dev.gate_bias), c.k, blas.stream())
          .to_host();
  const Tensor logits = linear(t, s.pb.full.gate_weight, s.pb.full.gate_bias);
  double scale = 0;
  for (std::int64_t i = 0; i < logits.numel(); ++i) {
    scale = std::max(scale, std::abs(logits.item(i)));
  }
  // The logits: the norm's sum of squares and the router's GEMM with its bias, in other orders.
  const ErrorModel lm{.dtype = c.dtype, .terms = 2 * c.hidden + 1};
  EXPECT_TRUE(
      test_support::unexplained_flips(logits, r, gpu_r, 2 * error_bound(lm, scale, scale)).empty());
  Tensor same = block;
  const std::vector<std::int64_t> flipped = test_support::flipped_tokens(r, gpu_r);
  for (const std::int64_t i : flipped) same.assign_slice(0, i, want.slice(0, i, 1));
  EXPECT_LE(flipped.size(), 1U) << "near-ties among a handful of random tokens";
  if (c.only_expert >= 0) {
    EXPECT_TRUE(flipped.empty()) << "exact ties go to the lower id";
  }
  expect_close(same, want, n, fmt::format("{} ep_mlp_block ({} excused)", s.label, flipped.size()));
}

/// ep_moe_backward against the rows and slices of the single-device moe_backward.
void check_backward(const MeshDevice& mesh, const EpMesh& m, const EpCase& c) {
  const EpSetup s = setup(mesh, m, c);
  SCOPED_TRACE(s.label);
  const MoeGrads want = ep_test::reference_grads(s.pb);
  mg::Blas blas;
  const mg::DeviceMoeGrads got =
      ep_moe_backward(mesh, blas, on_gpu(s.pb.t.slice(0, s.mine)), local_routing(s.pb.r, s.mine),
                      s.dev, on_gpu(s.pb.grad_out.slice(0, s.mine)), s.pb.config.moe_params(), s.o);
  const std::vector<std::int64_t>& mine =
      s.placement.experts_of[static_cast<std::size_t>(s.ep.index)];
  const std::int64_t ip = s.pb.config.intermediate_size / s.tp.size;
  const Range units{2 * s.tp.index * ip, 2 * ip};
  const ep_test::ChainTerms n = ep_test::chain_terms(s.pb, s.tp.size);
  expect_close(got.t.to_host(), want.t.slice(0, s.mine), n.grad_t, s.label + " grad t");
  expect_close(got.weights.to_host(), want.weights.slice(0, s.mine), n.grad_weights,
               s.label + " grad weights", ep_test::grad_weights_scale(s.pb).slice(0, s.mine));
  expect_close(got.mlp1_weight.to_host(), expert_slice(want.mlp1_weight, mine, 1, units),
               n.grad_mlp1, s.label + " grad mlp1_weight");
  expect_close(got.mlp1_bias.to_host(), expert_slice(want.mlp1_bias, mine, 1, units), n.grad_mlp1,
               s.label + " grad mlp1_bias");
  expect_close(got.mlp2_weight.to_host(),
               expert_slice(want.mlp2_weight, mine, 2, {s.tp.index * ip, ip}), n.grad_mlp2_weight,
               s.label + " grad mlp2_weight");
  expect_close(got.mlp2_bias.to_host(), expert_slice(want.mlp2_bias, mine), n.grad_mlp2_bias,
               s.label + " grad mlp2_bias");
}

TEST(GpuExpertParallel, ForwardAndBackwardMatchSingleDevice) {
  // 11 tokens, 5 experts top-2 (5 does not divide the EP sizes 2, 3, 4: uneven), f32, both
  // placements.
  for_each_ep_mesh([](const MeshDevice& mesh, const EpMesh& m) {
    for (const ExpertAssignment a : {ExpertAssignment::Contiguous, ExpertAssignment::Balanced}) {
      const EpCase c{.name = "random", .dtype = DType::f32, .assignment = a};
      check_forward(mesh, m, c);
      check_backward(mesh, m, c);
    }
  });
}

TEST(GpuExpertParallel, TheCpuTestsEdgeCases) {
  const std::vector<EpCase> cases{
      {.name = "one token", .tokens = 1, .dtype = DType::f32},
      {.name = "all tokens to expert 3 (ties)", .dtype = DType::f32, .only_expert = 3},
      {.name = "k = 1, experts without tokens", .k = 1, .dtype = DType::f32, .only_expert = 3},
      {.name = "k = E", .k = 5, .dtype = DType::f32},
      {.name = "k = 1", .tokens = 17, .k = 1, .dtype = DType::f32, .seed = 4},
  };
  for_each_ep_mesh([&](const MeshDevice& mesh, const EpMesh& m) {
    for (const EpCase& c : cases) {
      check_forward(mesh, m, c);
      check_backward(mesh, m, c);
    }
  });
}

TEST(GpuExpertParallel, CapacityDropsAsTheSingleDevice) {
  const std::vector<EpCase> cases{
      {.name = "capacity 1.0", .tokens = 13, .dtype = DType::f32, .capacity = 1.0},
      {.name = "capacity 1.0 balanced",
       .tokens = 13,
       .dtype = DType::f32,
       .assignment = ExpertAssignment::Balanced,
       .capacity = 1.0},
      {.name = "skewed capacity 0.5", .dtype = DType::f32, .capacity = 0.5, .only_expert = 3},
      {.name = "lowest weight 0.75",
       .tokens = 19,
       .dtype = DType::f32,
       .capacity = 0.75,
       .policy = DropPolicy::LowestWeight,
       .seed = 3},
  };
  for_each_ep_mesh([&](const MeshDevice& mesh, const EpMesh& m) {
    for (const EpCase& c : cases) {
      check_forward(mesh, m, c);
      check_backward(mesh, m, c);
    }
  });
}

TEST(GpuExpertParallel, Bf16AgainstF32) {
  // The bf16 run against the f32 single device on the same (bf16) values and routing: each step
  // rounds to bf16 (mlp1, swiglu's five, mlp2, the pairs' sum, the TP sum, the devices' sum).
  for_each_ep_mesh([](const MeshDevice& mesh, const EpMesh& m) {
    const EpSetup s = setup(mesh, m, {.name = "bf16", .tokens = 23, .dtype = DType::bf16});
    SCOPED_TRACE(s.label);
    const MoeParams p = s.pb.config.moe_params();
    const auto f32 = [](const Tensor& x) { return x.astype(DType::f32); };
    Routing r32 = s.pb.r;
    r32.weights = f32(r32.weights);
    const MlpWeights& w = s.pb.full;
    const Tensor y =
        moe_experts(f32(s.pb.t), r32, f32(w.mlp1_weight), f32(w.mlp1_bias), f32(w.mlp2_weight), p);
    const Tensor want = moe_combine(y, r32, f32(w.mlp2_bias)).slice(0, s.mine);
    mg::Blas blas;
    const GpuEpMoeResult got = ep_moe(mesh, blas, on_gpu(s.pb.t.slice(0, s.mine)),
                                      local_routing(s.pb.r, s.mine), s.dev, p, s.o);
    const std::int64_t n = ep_test::chain_terms(s.pb, s.tp.size).block;
    EXPECT_TRUE(testing::within_model(got.out, want, testing::chain_terms(n, 10)));
  });
}

TEST(GpuExpertParallel, BadInputIsTheSameErrorOnEveryDevice) {
  const MeshDevice& mesh = gpu::mesh_of(1, testing::world_size());
  const EpMesh m{1, testing::world_size(), 1};
  const EpSetup s = setup(mesh, m, {.name = "bad", .dtype = DType::f32});
  const MoeParams p = s.pb.config.moe_params();
  const DeviceTensor t = on_gpu(s.pb.t.slice(0, s.mine));
  const Routing r = local_routing(s.pb.r, s.mine);
  mg::Blas blas;
  MoeParams other_k = p;
  other_k.experts_per_token = 3;
  MESHTEST_EXPECT_ERROR(ep_moe(mesh, blas, t, r, s.dev, other_k, s.o), "the routing is for");
  GpuEpMlpWeights bad = s.dev;
  if (testing::world_rank() == 0) bad.mlp1_bias = on_gpu(Tensor(Shape{1, 1}, DType::f32));
  MESHTEST_EXPECT_ERROR(ep_moe(mesh, blas, t, r, bad, p, s.o), "mlp1_bias");
  GpuEpMlpWeights other_placement = s.dev;
  other_placement.placement = contiguous_placement(5, s.ep.size + 1);
  MESHTEST_EXPECT_ERROR(ep_moe(mesh, blas, t, r, other_placement, p, s.o),
                        "the expert placement is over");
  const EpSetup b = setup(mesh, m, {.name = "bf16", .dtype = DType::bf16});
  MESHTEST_EXPECT_ERROR(
      ep_moe_backward(mesh, blas, on_gpu(b.pb.t.slice(0, b.mine)), local_routing(b.pb.r, b.mine),
                      b.dev, on_gpu(b.pb.grad_out.slice(0, b.mine)), p, b.o),
      "not supported");
  EpOptions no_axis = s.o;
  no_axis.ep_axis = 2;
  MESHTEST_EXPECT_ERROR(ep_moe(mesh, blas, t, r, s.dev, p, no_axis), "ep_axis");
}

}  // namespace
}  // namespace meshtest::dist
