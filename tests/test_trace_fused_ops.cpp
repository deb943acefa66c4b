// Trace of the traceable compute ops qkv_rope, sdpa_sinks and experts: captured once, replayed
// after the inputs change in place; every replay must equal a fresh eager call on the new inputs
// bit for bit (f32 and bf16), and the profiler must show the replayed steps as compute ops.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "src/core/random.hpp"
#include "src/ops/moe/experts.hpp"
#include "src/ops/qkv_rope.hpp"
#include "src/ops/sdpa_sinks.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/trace.hpp"

namespace meshtest {
namespace test_trace_fused_ops {

// Overwrites t's contents in place (same buffer) with new random values.
void refill(Tensor& t, std::uint64_t seed) {
  const Tensor fresh = random_normal(t.shape(), t.dtype(), {.seed = seed});
  std::memcpy(t.bytes(), fresh.bytes(), t.nbytes());
}

// Captures `op` over `inputs` (moved into the trace) with every output kept, then for two
// rounds refills the inputs, overwrites the outputs with NaN, replays and compares with
// `op` called eagerly on copies of the new inputs.
template <class Op>
void expect_replays_equal_eager(std::vector<Tensor> inputs, const Op& op, std::size_t outputs) {
  perf::Trace t;
  std::vector<Tensor*> in, kept;
  for (Tensor& x : inputs) in.push_back(&t.input(std::move(x)));
  t.capture([&] {
    for (Tensor& o : op(in)) kept.push_back(&t.keep(std::move(o)));
  });
  ASSERT_EQ(t.size(), 1u);
  ASSERT_EQ(kept.size(), outputs);
  for (std::uint64_t round = 0; round < 2; ++round) {
    for (std::size_t i = 0; i < in.size(); ++i) refill(*in[i], 100 + 10 * round + i);
    std::vector<Tensor> copies;
    for (Tensor* x : in) copies.push_back(*x);
    std::vector<Tensor*> copy_ptrs;
    for (Tensor& x : copies) copy_ptrs.push_back(&x);
    const std::vector<Tensor> eager = op(copy_ptrs);
    for (Tensor* k : kept) k->fill(std::numeric_limits<double>::quiet_NaN());
    const perf::Session session;
    t.replay();
    for (std::size_t i = 0; i < outputs; ++i) {
      EXPECT_TRUE(kept[i]->bitwise_equal(eager[i])) << "round " << round << " output " << i;
    }
    const std::vector<perf::OpRecord> r = perf::records();
    ASSERT_EQ(r.size(), 1u);  // one compute record per replayed step, none of inner ops
    EXPECT_EQ(r[0].op_type, perf::OpType::compute);
    EXPECT_EQ(r[0].outputs.size(), outputs);
  }
}

class TraceFusedOps : public ::testing::TestWithParam<DType> {};

TEST_P(TraceFusedOps, QkvRopeReplayEqualsEager) {
  const DType dt = GetParam();
  const QkvRopeOptions o{.num_heads = 4,
                         .num_kv_heads = 2,
                         .rope = {.head_dim = 64},
                         .position_offset = 3,
                         .row_block = 2,        // 3 token panels of 5 tokens
                         .column_block = 192};  // weight blocks of 3 heads: 8 slots -> 3 blocks
  const std::int64_t tokens = 5, hidden = 16, qkv = 8 * 64;
  expect_replays_equal_eager(
      {random_normal({tokens, hidden}, dt, {.seed = 1}),
       random_normal({qkv, hidden}, dt, {.seed = 2}), random_normal({qkv}, dt, {.seed = 3})},
      [&](const std::vector<Tensor*>& in) {
        Qkv r = qkv_rope(*in[0], *in[1], *in[2], o);
        std::vector<Tensor> v;
        v.push_back(std::move(r.q));
        v.push_back(std::move(r.k));
        v.push_back(std::move(r.v));
        return v;
      },
      3);
}

TEST_P(TraceFusedOps, SdpaSinksReplayEqualsEager) {
  const DType dt = GetParam();
  const std::int64_t tokens = 7, kv_heads = 2, q_per_kv = 2, d = 4;
  const SdpaOptions o{.sliding_window = 4};
  expect_replays_equal_eager(
      {random_normal({tokens, kv_heads, q_per_kv, d}, dt, {.seed = 4}),
       random_normal({tokens, kv_heads, d}, dt, {.seed = 5}),
       random_normal({tokens, kv_heads, d}, dt, {.seed = 6}),
       random_normal({kv_heads * q_per_kv}, dt, {.seed = 7})},
      [&](const std::vector<Tensor*>& in) {
        std::vector<Tensor> v;
        v.push_back(sdpa_sinks(*in[0], *in[1], *in[2], *in[3], o, /*block=*/3));
        return v;
      },
      1);
}

// experts: the refilled t and router weights route the tokens to other experts, so a replay
// that kept the captured routing would differ from the eager call.
void expect_experts_replays(DType dt, bool bias) {
  const std::int64_t tokens = 9, hidden = 8, two_i = 12, e = 4;
  const MoeParams p{.experts_per_token = 2};
  std::vector<Tensor> inputs{random_normal({tokens, hidden}, dt, {.seed = 20}),
                             random_normal({e, hidden}, dt, {.seed = 21}),
                             random_normal({e}, dt, {.seed = 22}),
                             random_normal({e, two_i, hidden}, dt, {.seed = 23}),
                             random_normal({e, two_i}, dt, {.seed = 24}),
                             random_normal({e, hidden, two_i / 2}, dt, {.seed = 25})};
  if (bias) inputs.push_back(random_normal({e, hidden}, dt, {.seed = 26}));
  expect_replays_equal_eager(
      std::move(inputs),
      [&](const std::vector<Tensor*>& in) {
        const Tensor no_bias;
        const Tensor& mlp2_bias = in.size() > 6 ? *in[6] : no_bias;  // no copy of in[6]
        std::vector<Tensor> v;
        v.push_back(experts(*in[0], *in[1], *in[2], *in[3], *in[4], *in[5], mlp2_bias, p));
        return v;
      },
      1);
}

TEST_P(TraceFusedOps, ExpertsReplayRoutesTheNewInput) { expect_experts_replays(GetParam(), true); }

TEST_P(TraceFusedOps, ExpertsWithoutBiasReplayRoutesTheNewInput) {
  expect_experts_replays(GetParam(), false);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TraceFusedOps, ::testing::Values(DType::f32, DType::bf16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(i.param == DType::f32 ? "f32" : "bf16");
                         });

TEST(TraceFusedOps, QkvRopeAndSdpaSinksChainReplays) {
  // q, k, v kept by the first step are the second step's inputs.
  perf::Trace t;
  const std::int64_t tokens = 6, hidden = 16;
  Tensor& x = t.input(random_normal({tokens, hidden}, DType::f32, {.seed = 8}));
  Tensor& w = t.input(random_normal({8 * 64, hidden}, DType::f32, {.seed = 9}));
  Tensor& b = t.input(random_normal({8 * 64}, DType::f32, {.seed = 10}));
  Tensor& sinks = t.input(random_normal({4}, DType::f32, {.seed = 11}));
  const QkvRopeOptions o{.num_heads = 4, .num_kv_heads = 2, .rope = {.head_dim = 64}};
  Tensor* out = nullptr;
  t.capture([&] {
    Qkv qkv = qkv_rope(x, w, b, o);
    const Tensor& q = t.keep(std::move(qkv.q));
    const Tensor& k = t.keep(std::move(qkv.k));
    const Tensor& v = t.keep(std::move(qkv.v));
    out = &t.keep(sdpa_sinks(q, k, v, sinks));
  });
  EXPECT_EQ(t.ops(), (std::vector<std::string>{"qkv_rope", "sdpa_sinks"}));
  refill(x, 12);
  const Qkv e = qkv_rope(x, w, b, o);
  const Tensor expected = sdpa_sinks(e.q, e.k, e.v, sinks);
  out->fill(std::numeric_limits<double>::quiet_NaN());
  t.replay();
  EXPECT_TRUE(out->bitwise_equal(expected));
}

// The two qkv_rope inputs of the record tests, and a call on them.
struct QkvCall {
  perf::Trace t;
  Tensor& x = t.input(random_normal({3, 16}, DType::f32, {.seed = 30}));
  Tensor& w = t.input(random_normal({8 * 64, 16}, DType::f32, {.seed = 31}));
  Tensor& b = t.input(random_normal({8 * 64}, DType::f32, {.seed = 32}));
  void capture() {
    t.capture([&] {
      Qkv r = qkv_rope(x, w, b, {.num_heads = 4, .num_kv_heads = 2, .rope = {.head_dim = 64}});
      t.keep(std::move(r.q));
      t.keep(std::move(r.k));
      t.keep(std::move(r.v));
    });
  }
  std::vector<perf::OpRecord> replay_records() {
    const perf::Session session;
    t.replay();
    return perf::records();
  }
};

TEST(TraceFusedOps, ReplayedRecordCarriesTheCapturedAttributesAndFlops) {
  QkvCall c;
  std::vector<perf::OpRecord> captured;
  {
    const perf::Session session;
    c.capture();
    captured = perf::records();
  }
  ASSERT_EQ(captured.size(), 1u);
  ASSERT_FALSE(captured[0].attributes.empty());  // heads=4;kv_heads=2;head_dim=64;offset=0
  ASSERT_GT(captured[0].flops, 0);
  const std::vector<perf::OpRecord> replayed = c.replay_records();
  ASSERT_EQ(replayed.size(), 1u);
  EXPECT_EQ(replayed[0].op_code, "qkv_rope");
  EXPECT_EQ(replayed[0].attributes, captured[0].attributes);
  EXPECT_EQ(replayed[0].flops, captured[0].flops);
  EXPECT_EQ(replayed[0].bytes, captured[0].bytes);
}

TEST(TraceFusedOps, CaptureWithTheProfilerOffReplaysWithoutAttributes) {
  QkvCall c;
  c.capture();
  const std::vector<perf::OpRecord> replayed = c.replay_records();
  ASSERT_EQ(replayed.size(), 1u);
  EXPECT_EQ(replayed[0].attributes, "");
  EXPECT_EQ(replayed[0].flops, 0);
}

TEST(TraceFusedOps, AScopeThatOutlivesTheCaptureGivesItsStepNoRecord) {
  // Inside a fused scope opened before the capture, qkv_rope opens no scope of its own: its
  // step is added under the outer scope, which closes after the capture: one trace is gone by
  // then (a use after free without the guard: ASan), the other replays without a record.
  const perf::Session session;
  auto gone = std::make_unique<QkvCall>();
  auto kept = std::make_unique<QkvCall>();
  {
    perf::OpScope outer("outer", perf::OpScope::fused);
    gone->capture();
    kept->capture();
    gone.reset();
    outer.attr("closes", "after the captures");
  }
  const std::vector<perf::OpRecord> replayed = kept->replay_records();
  ASSERT_EQ(replayed.size(), 1u);
  EXPECT_EQ(replayed[0].op_code, "qkv_rope");
  EXPECT_EQ(replayed[0].attributes, "");
}

TEST(TraceFusedOps, TensorStepWithAnEmptyTensorIsAnError) {
  perf::Trace t;
  const Tensor x(Shape{0, 4}, DType::f32);
  const Tensor y(Shape{2}, DType::f32);
  const std::vector<const Tensor*> ins{&x}, outs{&y};
  try {
    t.add_tensor_step("op", perf::OpType::compute, ins, outs,
                      [](std::span<const Tensor* const>, std::span<Tensor* const>) {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step op has an empty input or output"), std::string::npos)
        << e.what();
  }
}

}  // namespace test_trace_fused_ops
}  // namespace meshtest
