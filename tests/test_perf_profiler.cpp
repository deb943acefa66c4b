// The profiler's OpScope: records, leaf-only nesting (at any depth), signposts, exceptions, off
// by default, device times resolved when the records are read.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>

#include "src/perf/profiler.hpp"

namespace meshtest::perf {
namespace test_perf_profiler {

TEST(Profiler, OffByDefaultRecordsNothing) {
  clear();
  ASSERT_FALSE(enabled());
  {
    OpScope s("matmul");
    EXPECT_FALSE(s.active());
  }
  signpost("start");
  EXPECT_TRUE(records().empty());
}

TEST(Profiler, RecordsOneOpWithItsTensorsAndAttributes) {
  Session session;
  set_device_id(3);
  const Tensor x({2, 3}, DType::f32), y({2, 4}, DType::bf16);
  {
    OpScope s("linear");
    s.input(x, "Shard(0)").output(y).attr("bias", true).attr("k", 3).bytes(40).flops(48);
  }
  set_device_id(0);
  const auto r = records();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].op_code, "linear");
  EXPECT_EQ(r[0].op_type, OpType::compute);
  EXPECT_EQ(r[0].device_id, 3);
  EXPECT_EQ(r[0].global_call_count, 1);
  EXPECT_EQ(r[0].attributes, "bias=true;k=3");
  ASSERT_EQ(r[0].inputs.size(), 1u);
  EXPECT_EQ(r[0].inputs[0], (TensorInfo{Shape{2, 3}, DType::f32, "Shard(0)"}));
  ASSERT_EQ(r[0].outputs.size(), 1u);
  EXPECT_EQ(r[0].outputs[0], (TensorInfo{Shape{2, 4}, DType::bf16, "DEVICE"}));
  EXPECT_EQ(r[0].bytes, 40);
  EXPECT_EQ(r[0].flops, 48);
  EXPECT_GE(r[0].end_ns, r[0].start_ns);
}

TEST(Profiler, OnlyLeafScopesAreRecordedInCallOrder) {
  Session session;
  signpost("start");
  {
    OpScope block("transformer_block");
    { OpScope a("rms_norm"); }
    { OpScope b("all_reduce", OpType::ccl); }
  }
  { OpScope lone("embedding"); }
  signpost("stop");
  const auto r = records();
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(r[0].op_type, OpType::signpost);
  EXPECT_EQ(r[0].attributes, "start");
  EXPECT_EQ(r[1].op_code, "rms_norm");
  EXPECT_EQ(r[2].op_code, "all_reduce");
  EXPECT_EQ(r[2].op_type, OpType::ccl);
  EXPECT_EQ(r[3].op_code, "embedding");
  EXPECT_EQ(r[4].attributes, "stop");
  for (std::size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i].global_call_count, static_cast<std::int64_t>(i + 1));
    if (i > 0) {
      EXPECT_GE(r[i].start_ns, r[i - 1].end_ns);
    }
  }
}

TEST(Profiler, AGrandparentCompositeIsNotRecordedOnlyItsLeaves) {
  // model > block > {attention > {linear, sdpa}, add}: the composites two and three levels
  // above a leaf (block, model) are not recorded, nor is attention; a sibling leaf of a
  // composite (add) is.
  Session session;
  {
    OpScope model("model");
    {
      OpScope block("block");
      {
        OpScope attention("attention");
        { OpScope a("linear"); }
        { OpScope b("sdpa"); }
      }
      { OpScope c("add"); }
    }
  }
  const auto r = records();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].op_code, "linear");
  EXPECT_EQ(r[1].op_code, "sdpa");
  EXPECT_EQ(r[2].op_code, "add");
}

TEST(Profiler, AFusedOpIsOneRecordAndItsInnerScopesRecordNothing) {
  // block > {fused qkv_rope > {rope_table, linear > matmul}, fused inside fused, add}: the
  // fused op is a leaf with its own inputs; nothing inside it is recorded at any depth; the
  // composite around it is dropped as usual.
  Session session;
  const Tensor x({3, 8}, DType::f32);
  {
    OpScope block("block");
    {
      OpScope fused("qkv_rope", OpScope::fused);
      EXPECT_TRUE(fused.active());
      fused.input(x).attr("heads", 2);
      {
        OpScope inner("rope_table");
        EXPECT_FALSE(inner.active());
      }
      {
        OpScope linear("linear");
        OpScope matmul("matmul");
        EXPECT_FALSE(linear.active());
        EXPECT_FALSE(matmul.active());
      }
      {
        OpScope nested("sdpa_sinks", OpScope::fused);
        EXPECT_FALSE(nested.active());
      }
    }
    { OpScope c("add"); }
  }
  const auto r = records();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].op_code, "qkv_rope");
  EXPECT_EQ(r[0].attributes, "heads=2");
  ASSERT_EQ(r[0].inputs.size(), 1u);
  EXPECT_EQ(r[0].inputs[0].shape, (Shape{3, 8}));
  EXPECT_EQ(r[1].op_code, "add");
  // Off: a fused scope is as inactive as any other.
  set_enabled(false);
  {
    OpScope off("qkv_rope", OpScope::fused);
    EXPECT_FALSE(off.active());
    OpScope inner("rope_table");
    EXPECT_FALSE(inner.active());
  }
}

TEST(Profiler, AThrowingOpIsNotRecorded) {
  Session session;
  EXPECT_THROW(
      {
        OpScope s("bad");
        throw std::runtime_error("x");
      },
      std::runtime_error);
  EXPECT_TRUE(records().empty());
}

TEST(Profiler, SessionRestoresTheFlagAndClears) {
  {
    Session session;
    OpScope s("x");
  }
  EXPECT_FALSE(enabled());
  EXPECT_TRUE(records().empty());
}

/// Device times that a test sets: counts its calls, resolves to fixed times.
struct FakeTimes : DeviceTimes {
  FakeTimes(int* closes, int* resolves, std::int64_t start, std::int64_t end)
      : closes(closes), resolves(resolves), start(start), end(end) {}
  void close() override { ++*closes; }
  std::pair<std::int64_t, std::int64_t> resolve() override {
    ++*resolves;
    return {start, end};
  }
  int* closes;
  int* resolves;
  std::int64_t start, end;
};

TEST(Profiler, DeviceTimesReplaceTheHostTimesWhenTheRecordsAreRead) {
  Session session;
  int closes = 0, resolves = 0;
  {
    OpScope s("kernel");
    s.device_times(std::make_unique<FakeTimes>(&closes, &resolves, 1000, 4000));
    EXPECT_EQ(closes, 0);
  }
  { OpScope host("host_op"); }
  EXPECT_EQ(closes, 1);
  EXPECT_EQ(resolves, 0);  // nothing waits for the device before the records are read
  const auto r = records();
  EXPECT_EQ(resolves, 1);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].start_ns, 1000);
  EXPECT_EQ(r[0].end_ns, 4000);
  EXPECT_EQ(r[0].global_call_count, 1);
  EXPECT_NE(r[1].start_ns, 1000);  // the host op keeps the host clock
  EXPECT_TRUE(r[0].timed_on_device);
  EXPECT_FALSE(r[1].timed_on_device);
  const auto again = records();  // resolved once, kept
  EXPECT_EQ(resolves, 1);
  EXPECT_EQ(again[0].end_ns, 4000);
}

TEST(Profiler, DeviceTimesOfADroppedScopeAreNeverResolved) {
  Session session;
  int closes = 0, resolves = 0;
  {
    OpScope composite("block");
    composite.device_times(std::make_unique<FakeTimes>(&closes, &resolves, 1, 2));
    OpScope leaf("linear");
  }
  EXPECT_THROW(
      {
        OpScope s("bad");
        s.device_times(std::make_unique<FakeTimes>(&closes, &resolves, 1, 2));
        throw std::runtime_error("x");
      },
      std::runtime_error);
  {
    OpScope pending("pending");
    pending.device_times(std::make_unique<FakeTimes>(&closes, &resolves, 1, 2));
  }
  clear();  // drops the pending one unresolved
  const auto r = records();
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(resolves, 0);
  set_enabled(false);
  OpScope off("off");
  off.device_times(std::make_unique<FakeTimes>(&closes, &resolves, 1, 2));
  EXPECT_FALSE(off.active());
}

TEST(Profiler, OpTypeNamesRoundTripAndUnknownNamesThrow) {
  for (OpType t : {OpType::compute, OpType::ccl, OpType::signpost}) {
    EXPECT_EQ(op_type_from_name(op_type_name(t)), t);
  }
  EXPECT_THROW(op_type_from_name("kernel"), Error);
}

}  // namespace test_perf_profiler
}  // namespace meshtest::perf
