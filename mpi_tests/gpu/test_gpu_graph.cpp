// Trace mode on GPUs (src/gpu/graph.hpp): the TP MLP, the attention projections and the
// collectives captured once into a CUDA graph and replayed on fresh inputs, each replay bit for
// bit the eager calls on the same inputs, on every mesh shape and axis of the world; the
// fused-op kit's trace mode on a GPU op (dist/testing/gpu_fused.hpp); one timed record per
// replay; misuse is an Error. Skips every test, with the reason, where a rank has no GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dist/gpu/ccl/ccl.hpp"
#include "dist/gpu/parallel/tp_attention.hpp"
#include "dist/gpu/parallel/tp_mlp.hpp"
#include "dist/parallel/tp_shard.hpp"
#include "dist/testing/gpu/gpu_test.hpp"
#include "dist/testing/gpu_fused.hpp"
#include "mpi_tests/gpu/gpu_terms.hpp"
#include "src/core/random.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/graph.hpp"
#include "src/gpu/linear.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dist {
namespace {

using gpu::for_each_mesh_axis;
using meshtest::gpu::Graph;
using testing::error_message_of;

constexpr std::int64_t kTokens = 11;

Tensor normal(Shape s, DType t, std::uint64_t stream, double std = 1.0) {
  return random_normal(s, t, {.seed = 31, .stream = stream}, 0.0, std);
}

/// Writes `values` into x's buffer (the one the graph reads), outside the capture.
void overwrite(DeviceTensor& x, const Tensor& values) {
  x.assign_slice(0, 0, DeviceTensor::from_host(values));
}

/// Captures `ops` (which writes its outputs into `outs`) once, then for three fresh inputs
/// (`refill(round)` writes them in place) replays it and expects every output to equal, bit for
/// bit, what `ops` gives eagerly on the same inputs.
void expect_replays_equal_eager(const std::function<void(std::vector<DeviceTensor>&)>& ops,
                                const std::function<void(int)>& refill, const std::string& what) {
  Graph g;
  std::vector<DeviceTensor> outs;
  g.capture([&] { ops(outs); });
  ASSERT_TRUE(g.captured()) << what;
  EXPECT_GT(g.nodes(), 0U) << what << ": the graph recorded no work";
  for (int round = 0; round < 3; ++round) {
    refill(round);
    g.replay();
    g.synchronize();
    std::vector<DeviceTensor> eager;
    ops(eager);
    ASSERT_EQ(outs.size(), eager.size()) << what;
    for (std::size_t k = 0; k < outs.size(); ++k) {
      EXPECT_TRUE(outs[k].bitwise_equal(eager[k]))
          << what << ": output " << k << " of replay " << round << " differs from the eager call";
    }
  }
}

TEST(GpuGraph, TpMlpReplaysAreTheEagerCalls) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis), i = mesh.axis_index(axis);
    const std::int64_t hidden = 24, units = 6 * p;
    for (DType t : {DType::f32, DType::bf16}) {
      const TpMlpShard w =
          shard_mlp(normal({2 * units, hidden}, t, 1), normal({2 * units}, t, 2),
                    normal({hidden, units}, t, 3, 0.2), normal({hidden}, t, 4), p, i);
      meshtest::gpu::Blas blas;
      DeviceTensor x = DeviceTensor::from_host(normal({kTokens, hidden}, t, 5));
      expect_replays_equal_eager(
          [&](std::vector<DeviceTensor>& out) {
            out.clear();
            out.push_back(tp_mlp(mesh, blas, x, w, {.tp = {.axis = axis}}));
          },
          [&](int round) {
            overwrite(x, normal({kTokens, hidden}, t, 10 + round, 2.0));
          },
          fmt::format("{} tp_mlp on {} of {}", t, i, p));
    }
  });
}

TEST(GpuGraph, AttentionProjectionsReplaysAreTheEagerCalls) {
  const GptOssConfig c = GptOssConfig::tiny_tp();
  for_each_mesh_axis([&](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis), i = mesh.axis_index(axis);
    const DType t = DType::bf16;
    const BlockWeights full = init_block_weights(c, 0, t, RandomInit{.seed = 6});
    const TpAttentionProjections w = to_device(
        shard_attention_weights(weight_source(full, 0), c, 0, TpRank{.size = p, .index = i}));
    const std::int64_t hp = c.num_attention_heads / p * c.head_dim;
    meshtest::gpu::Blas blas;
    DeviceTensor x = DeviceTensor::from_host(normal({kTokens, c.hidden_size}, t, 7));
    expect_replays_equal_eager(
        [&](std::vector<DeviceTensor>& out) {
          out.clear();
          out.push_back(tp_qkv_projection(blas, x, w));
          // Eagerly, slice copies on another stream: the GEMM must have finished (DeviceTensor's
          // rule). Inside the capture this waits for nothing: the one stream keeps the order.
          blas.synchronize();
          out.push_back(tp_out_projection(mesh, blas, out[0].slice(1, 0, hp), w, {.axis = axis}));
        },
        [&](int round) {
          overwrite(x, normal({kTokens, c.hidden_size}, t, 20 + round));
        },
        fmt::format("attention projections on {} of {}", i, p));
  });
}

TEST(GpuGraph, CollectivesReplaysAreTheEagerCalls) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis), me = mesh.device_id();
    const Shape s{2 * p + 1, 3 * p + 2};  // uneven over p > 1; dim 1 is packed on the GPU
    for (DType t : {DType::f32, DType::bf16}) {
      DeviceTensor x = DeviceTensor::from_host(gpu::term(s, t, me));
      expect_replays_equal_eager(
          [&](std::vector<DeviceTensor>& out) {
            out.clear();
            out.push_back(all_gather(mesh, x, {.dim = 1, .axis = axis}));
            out.push_back(reduce_scatter(mesh, x, {.dim = 1, .axis = axis}));
            out.push_back(all_reduce(mesh, x, {.axis = axis}));
            out.push_back(all_reduce(mesh, x, {.axis = axis, .numerics = Numerics::nccl}));
            out.push_back(all_reduce(mesh, x, {.axis = axis, .op = ReduceOp::max}));
            out.push_back(all_to_all(mesh, x, {.split_dim = 1, .concat_dim = 0, .axis = axis}));
            DeviceTensor in_place = x;
            all_reduce_inplace(mesh, in_place, {.axis = axis});
            out.push_back(std::move(in_place));
          },
          [&](int round) { overwrite(x, gpu::term(s, t, me, 1 + round)); },
          fmt::format("{} collectives on {}", t, mesh.str()));
    }
  });
}

TEST(GpuGraph, TheFusedOpKitsTraceModeReplaysTheGraph) {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const MeshDevice& mesh = gpu::mesh_of(1, n);
  const std::int64_t hidden = 16, units = 4 * n;
  const DType t = DType::bf16;
  const TpMlpShard w =
      shard_mlp(normal({2 * units, hidden}, t, 30), normal({2 * units}, t, 31),
                normal({hidden, units}, t, 32, 0.2), normal({hidden}, t, 33), n, mesh.device_id());
  meshtest::gpu::Blas blas;
  const testing::FusedFn fused = testing::on_gpu_fused(
      [&](const testing::FusedSetup&, const MeshDevice& m, const std::vector<DeviceTensor>& in) {
        std::vector<DeviceTensor> out;
        out.push_back(tp_mlp(m, blas, in[0], w));
        return out;
      });
  const Tensor x = normal({kTokens, hidden}, t, 34);
  testing::FusedSetup s{.params = {.seqlen = kTokens, .trace = true}, .mesh = {1, n}};
  std::vector<Tensor> eager;
  {
    testing::FusedSetup eager_setup = s;
    eager_setup.params.trace = false;
    testing::FusedRunner runner(mesh, fused, eager_setup, {x});
    eager = runner.run();
  }
  // The runner's capture checks its first replay against the captured eager call (outputs
  // overwritten with NaN first); a real replay, not the eager fallback.
  testing::FusedRunner runner(mesh, fused, s, {x});
  EXPECT_FALSE(runner.replay_is_eager()) << "the GPU op's trace step was not taken as a replay";
  for (int k = 0; k < 2; ++k) {
    const std::vector<Tensor> replayed = runner.run();
    ASSERT_EQ(replayed.size(), 1U);
    EXPECT_TRUE(replayed[0].bitwise_equal(eager[0])) << "replay " << k << " differs from eager";
  }
}

TEST(GpuGraph, EachReplayIsOneOpTimedOnTheDevice) {
  const DType t = DType::f32;
  const DeviceTensor x = DeviceTensor::from_host(normal({kTokens, 8}, t, 40));
  const DeviceTensor wt = DeviceTensor::from_host(normal({4, 8}, t, 41));
  meshtest::gpu::Blas blas;
  Graph g;
  std::vector<perf::OpRecord> rs;
  {
    const perf::Session session;
    DeviceTensor y;
    g.capture([&] { y = meshtest::gpu::linear(blas, x, wt); });
    for (int k = 0; k < 3; ++k) g.replay();
    g.synchronize();
    rs = perf::records();
  }
  std::vector<std::string> codes;
  for (const perf::OpRecord& r : rs) {
    codes.push_back(r.op_code);
    if (r.op_code == "cuda_graph") {
      EXPECT_TRUE(r.timed_on_device);
    }
  }
  EXPECT_EQ(codes, (std::vector<std::string>{"cuda_graph_capture", "cuda_graph", "cuda_graph",
                                             "cuda_graph"}));
}

TEST(GpuGraph, MisuseIsAnError) {
  const DeviceTensor x = DeviceTensor::from_host(normal({3, 8}, DType::f32, 50));
  const DeviceTensor wt = DeviceTensor::from_host(normal({4, 8}, DType::f32, 51));
  meshtest::gpu::Blas blas;
  Graph g;
  MESHTEST_EXPECT_ERROR(g.replay(), "replay() before a capture");
  // A host copy inside the capture: an Error, and the graph and the thread recover.
  const std::string host = error_message_of(
      [&] { g.capture([&] { (void)meshtest::gpu::linear(blas, x, wt).to_host(); }); });
  EXPECT_NE(host.find("to_host inside a gpu::Graph capture"), std::string::npos) << host;
  EXPECT_FALSE(g.captured());
  EXPECT_EQ(meshtest::gpu::capturing_stream(), nullptr);
  Graph inner;
  const std::string nested = error_message_of([&] { g.capture([&] { inner.capture([] {}); }); });
  EXPECT_NE(nested.find("capture inside another capture"), std::string::npos) << nested;
  DeviceTensor y;
  g.capture([&] { y = meshtest::gpu::linear(blas, x, wt); });
  MESHTEST_EXPECT_ERROR(g.capture([] {}), "already captured");
  g.replay();
  g.synchronize();
  const DeviceTensor eager = meshtest::gpu::linear(blas, x, wt);
  blas.synchronize();
  EXPECT_TRUE(y.bitwise_equal(eager)) << "the capture after two refused ones replays wrong";
}

}  // namespace
}  // namespace meshtest::dist
