// The tensor-parallel block on GPUs (dist/gpu/parallel/tp_linear.hpp, tp_mlp.hpp, tp_attention.hpp)
// against meshtest's CPU single-device ops on the same weights, within the error model
// (src/check/tolerance.hpp), f32 and bf16, with the TP axis each axis group of every mesh shape
// of the world (gpu_terms.hpp's for_each_mesh_axis); the per-op records of a TP MLP timed on the
// stream; bad input is an Error naming what is wrong, the same on every device of a collective.
// Skips every test, with the reason, where a rank has no GPU of its own.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dist/gpu/parallel/tp_attention.hpp"
#include "dist/gpu/parallel/tp_linear.hpp"
#include "dist/gpu/parallel/tp_mlp.hpp"
#include "dist/parallel/tp_shard.hpp"
#include "dist/testing/gpu/gpu_test.hpp"
#include "mpi_tests/gpu/gpu_terms.hpp"
#include "src/check/gpt_oss_chains.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/linear.hpp"
#include "src/gpu/runtime.hpp"
#include "src/gpu/swiglu.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/ops/activations.hpp"
#include "src/ops/linear.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dist {
namespace {

using gpu::for_each_mesh_axis;
using testing::error_message_of;

class GpuTp : public ::testing::Test {
 protected:
  void SetUp() override { testing::set_test_timeout(std::chrono::seconds(300)); }
};

constexpr DType kDTypes[] = {DType::f32, DType::bf16};
constexpr std::int64_t kTokens = 11;

Tensor normal(Shape s, DType t, std::uint64_t stream, double std = 1.0) {
  return random_normal(s, t, {.seed = 29, .stream = stream}, 0.0, std);
}

/// Expects this device's `got` (a GPU result brought back) within the error model of `expected`
/// (this device's part of the CPU reference), and the verdict to be the same on every device
/// of the world (one MPI_Allreduce), so a failure shows on every rank with its own worst
/// element.
void expect_within(const Tensor& expected, const Tensor& got, const Chain& chain, DType t,
                   const std::string& what) {
  const ErrorModel model = chain.model(t);
  const Comparison c = compare(expected, got, model);
  int mine = c.passed ? 0 : 1, any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_TRUE(c.passed) << what << " (" << model.str() << "): error/bound " << c.value
                        << " at element " << c.worst_index << ": expected " << c.expected_at_worst
                        << ", got " << c.got_at_worst;
  EXPECT_EQ(any, 0) << what << ": another device's result is outside the model";
}

DeviceTensor on_gpu(const Tensor& t) { return DeviceTensor::from_host(t); }

TEST_F(GpuTp, ColumnThenRowParallelLinearMatchesTheCpuLinear) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis), i = mesh.axis_index(axis);
    const std::int64_t in = 24, mid = 4 * p + 3, out = 20;  // mid: uneven over p > 1
    const Range mine = split_range(mid, p, i);
    for (DType t : kDTypes) {
      const std::string what =
          fmt::format("{} linear pair {}x{}x{} on {} of {}", t, in, mid, out, i, p);
      const Tensor x = normal({kTokens, in}, t, 1), w1 = normal({mid, in}, t, 2, 0.2),
                   b1 = normal({mid}, t, 3), w2 = normal({out, mid}, t, 4, 0.2),
                   b2 = normal({out}, t, 5);
      const Tensor y1 = linear(x, w1, b1), y = linear(y1, w2, b2);  // the CPU reference

      meshtest::gpu::Blas blas;
      const DeviceTensor w1_i = on_gpu(w1.slice(0, mine)), b1_i = on_gpu(b1.slice(0, mine));
      const DeviceTensor col = column_parallel_linear(blas, on_gpu(x), w1_i, &b1_i);
      blas.synchronize();
      expect_within(y1.slice(1, mine), col.to_host(), {.terms = in + 1}, t, what + " column");
      const DeviceTensor w2_i = on_gpu(w2.slice(1, mine)), b2_all = on_gpu(b2);
      const DeviceTensor row = row_parallel_linear(mesh, blas, col, w2_i, &b2_all, {.axis = axis});
      expect_within(y, row.to_host(), {.terms = in + 1 + mid + 1 + p, .bf16_roundings = 2}, t,
                    what + " row");
    }
  });
}

TEST_F(GpuTp, OverOneDeviceTheRowParallelLinearIsTheCpuLinear) {
  // One device: the bias joins the GEMM's f32 sum and the all_reduce copies, so bf16 differs
  // from the CPU only by the order of the f32 sum (checked within the model, r = 0).
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    if (mesh.axis_size(axis) != 1) return;
    for (DType t : kDTypes) {
      const Tensor x = normal({kTokens, 40}, t, 6), w = normal({16, 40}, t, 7, 0.2),
                   b = normal({16}, t, 8);
      meshtest::gpu::Blas blas;
      const DeviceTensor wd = on_gpu(w), bd = on_gpu(b);
      const DeviceTensor y = row_parallel_linear(mesh, blas, on_gpu(x), wd, &bd, {.axis = axis});
      expect_within(linear(x, w, b), y.to_host(), {.terms = 41}, t,
                    fmt::format("{} row-parallel over one device", t));
    }
  });
}

TEST_F(GpuTp, SwigluMatchesTheCpuOp) {
  meshtest::gpu::Blas blas;
  for (DType t : kDTypes) {
    // Spread over +-20: both clamps (limit 7) and the sigmoid's tails are exercised.
    const Tensor x = normal({kTokens, 2 * 37}, t, 9, 8.0);
    const DeviceTensor y = meshtest::gpu::swiglu(on_gpu(x), blas.stream());
    blas.synchronize();
    expect_within(swiglu(x), y.to_host(), {.terms = 1, .bf16_roundings = 4}, t,
                  fmt::format("{} swiglu", t));
  }
}

TEST_F(GpuTp, MlpMatchesTheCpuOps) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis), i = mesh.axis_index(axis);
    const std::int64_t hidden = 24, units = 6 * p;
    for (DType t : kDTypes) {
      const Tensor x = normal({kTokens, hidden}, t, 10, 2.0),
                   w1 = normal({2 * units, hidden}, t, 11), b1 = normal({2 * units}, t, 12),
                   w2 = normal({hidden, units}, t, 13, 0.2), b2 = normal({hidden}, t, 14);
      const Tensor y = linear(swiglu(linear(x, w1, b1)), w2, b2);
      meshtest::gpu::Blas blas;
      const TpMlpShard w = shard_mlp(w1, b1, w2, b2, p, i);
      const DeviceTensor got = tp_mlp(mesh, blas, on_gpu(x), w, {.tp = {.axis = axis}});
      // mlp1 (hidden + bias), mlp2 (units + bias, the all_reduce); roundings: mlp1's output,
      // swiglu's five steps, mlp2's partial.
      expect_within(
          y, got.to_host(), {.terms = hidden + 1 + units + 1 + p, .bf16_roundings = 1 + 5 + 1}, t,
          fmt::format("{} tp_mlp hidden {} intermediate {} on {} of {}", t, hidden, units, i, p));
    }
  });
}

TEST_F(GpuTp, AttentionProjectionsMatchTheCpuLinears) {
  const GptOssConfig c = GptOssConfig::tiny_tp();  // 16 q / 8 kv heads of 8, hidden 64
  const std::int64_t d = c.head_dim, h = c.num_attention_heads, kv = c.num_key_value_heads;
  for_each_mesh_axis([&](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis), i = mesh.axis_index(axis);
    for (DType t : kDTypes) {
      const BlockWeights full = init_block_weights(c, 0, t, RandomInit{.seed = 5});
      const AttentionWeights shard =
          shard_attention_weights(weight_source(full, 0), c, 0, TpRank{.size = p, .index = i});
      const Tensor x = normal({kTokens, c.hidden_size}, t, 15);
      // CPU: qkv of every head, o = the q columns (a stand-in for the attention's output), out.
      const Tensor qkv = linear(x, full.attn.qkv_weight, full.attn.qkv_bias);
      const Tensor o = qkv.slice(1, 0, h * d);
      const Tensor y = linear(o, full.attn.out_weight, full.attn.out_bias);
      const std::int64_t hp = h / p * d, kvp = kv / p * d;
      const Tensor qkv_i = concat({qkv.slice(1, i * hp, hp), qkv.slice(1, h * d + i * kvp, kvp),
                                   qkv.slice(1, (h + kv) * d + i * kvp, kvp)},
                                  1);

      meshtest::gpu::Blas blas;
      const TpAttentionProjections w = to_device(shard);
      const DeviceTensor got_qkv = tp_qkv_projection(blas, on_gpu(x), w);
      blas.synchronize();
      const std::string what = fmt::format("{} attention projections on {} of {}", t, i, p);
      expect_within(qkv_i, got_qkv.to_host(), {.terms = c.hidden_size + 1}, t, what + " qkv");
      const DeviceTensor got =
          tp_out_projection(mesh, blas, got_qkv.slice(1, 0, hp), w, {.axis = axis});
      expect_within(y, got.to_host(),
                    {.terms = c.hidden_size + 1 + h * d + 1 + p, .bf16_roundings = 2}, t,
                    what + " out");
    }
  });
}

TEST_F(GpuTp, EachOpRecordsItsDeviceTime) {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const MeshDevice& mesh = gpu::mesh_of(1, n);
  const int p = mesh.size(), i = mesh.device_id();
  const Tensor x = normal({64, 32}, DType::bf16, 16), w1 = normal({16 * p, 32}, DType::bf16, 17),
               b1 = normal({16 * p}, DType::bf16, 18), w2 = normal({32, 8 * p}, DType::bf16, 19),
               b2 = normal({32}, DType::bf16, 20);
  meshtest::gpu::Blas blas;
  const TpMlpShard w = shard_mlp(w1, b1, w2, b2, p, i);
  const DeviceTensor xd = on_gpu(x);
  std::vector<perf::OpRecord> rs;
  {
    const perf::Session session;
    (void)tp_mlp(mesh, blas, xd, w);
    rs = perf::records();
  }
  std::vector<std::string> codes;
  for (const perf::OpRecord& r : rs) {
    codes.push_back(r.op_code);
    EXPECT_GT(r.duration_ns(), 0) << r.op_code;
  }
  EXPECT_EQ(codes, (std::vector<std::string>{"linear", "swiglu", "linear", "all_reduce_inplace"}));
  ASSERT_EQ(rs.size(), 4u);
  EXPECT_EQ(rs[0].attributes, "in=32;out=16;bias=true");
  EXPECT_EQ(rs[0].inputs.size(), 3u);
  EXPECT_GE(rs[1].start_ns, rs[0].end_ns) << "the stream runs swiglu after mlp1";
}

TEST_F(GpuTp, BadInputIsAnErrorNamingIt) {
  meshtest::gpu::Blas blas;
  const DeviceTensor x = on_gpu(normal({4, 8}, DType::f32, 21));
  const DeviceTensor w = on_gpu(normal({6, 8}, DType::f32, 22));
  const DeviceTensor w_bad = on_gpu(normal({6, 9}, DType::f32, 23));
  const DeviceTensor b16 = on_gpu(normal({6}, DType::bf16, 24));
  MESHTEST_EXPECT_ERROR(meshtest::gpu::linear(blas, x, w_bad),
                        "gpu linear: weight is f32[6, 9] on cuda:");
  MESHTEST_EXPECT_ERROR(meshtest::gpu::linear(blas, x, w, b16),
                        "gpu linear: bias is bf16[6] on cuda:");
  MESHTEST_EXPECT_ERROR(meshtest::gpu::swiglu(w_bad, blas.stream()),
                        "gpu swiglu: x is f32[6, 9] on cuda:");
  // Host memory where device memory is needed.
  std::vector<float> host(64);
  MESHTEST_EXPECT_ERROR(
      blas.gemm(DType::f32, 4, 6, 8, host.data(), w.bytes(), nullptr, host.data()),
      "is host memory, not memory of cuda:");
  MESHTEST_EXPECT_ERROR(
      blas.gemm_unchecked(DType::f64, 4, 6, 8, x.bytes(), w.bytes(), nullptr, nullptr),
      "dtype f64 is not supported");
  // A tensor on another GPU than the Blas's (where this rank sees two).
  if (meshtest::gpu::device_count() >= 2) {
    const int other = (blas.device() + 1) % meshtest::gpu::device_count();
    const meshtest::gpu::DeviceGuard guard(other);
    const DeviceTensor w_other = on_gpu(normal({6, 8}, DType::f32, 22));
    MESHTEST_EXPECT_ERROR(meshtest::gpu::linear(blas, x, w_other),
                          fmt::format("weight is f32[6, 8] on cuda:{}, but the op runs on cuda:{}",
                                      other, blas.device()));
  }
  MESHTEST_EXPECT_ERROR(
      shard_mlp(Tensor(Shape{6, 8}, DType::f32), Tensor(Shape{6}, DType::f32),
                Tensor(Shape{8, 3}, DType::f32), Tensor(Shape{8}, DType::f32), 2, 0),
      "intermediate_size = 3 does not split over 2 devices");
}

TEST_F(GpuTp, ARowParallelShapeErrorOnOneDeviceIsTheSameErrorOnAll) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    meshtest::gpu::Blas blas;
    const int p = mesh.axis_size(axis);
    const DeviceTensor x = on_gpu(normal({4, 8}, DType::f32, 25));
    // Axis index p - 1 holds a weight whose in does not match x's.
    const std::int64_t in = mesh.axis_index(axis) == p - 1 ? 9 : 8;
    const DeviceTensor w = on_gpu(normal({6, in}, DType::f32, 26));
    const std::string msg =
        error_message_of([&] { row_parallel_linear(mesh, blas, x, w, nullptr, {.axis = axis}); });
    EXPECT_NE(
        msg.find(fmt::format("device {} of {} rejected its input: row_parallel_linear", p - 1, p)),
        std::string::npos)
        << msg;
    EXPECT_NE(msg.find("weight is f32[6, 9]"), std::string::npos) << msg;
  });
}

}  // namespace
}  // namespace meshtest::dist
