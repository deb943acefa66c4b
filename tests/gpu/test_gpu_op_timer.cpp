// gpu::time_on_stream: an op's record takes its times from CUDA events on its stream — the
// kernel's time, not the host's (the scope closes long before a 20 ms kernel ends: timing does
// not serialize the stream), resolved when the records are read; consecutive ops on one stream
// in order; a long run reuses the events of finished timers; nothing when the profiler is off.
#include <gtest/gtest.h>

#include <cstdint>

#include "src/gpu/op_timer.hpp"
#include "src/gpu/runtime.hpp"
#include "src/perf/profiler.hpp"
#include "tests/gpu/spin_kernel.hpp"

namespace meshtest::gpu {
namespace {

using testing::launch_spin;

/// SM clock cycles in `ms` milliseconds on the current device.
std::int64_t cycles_in_ms(double ms) {
  int khz = 0;
  MESHTEST_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, current_device()));
  return static_cast<std::int64_t>(ms * khz);
}

TEST(OpTimer, TheRecordTakesTheKernelsTimeWithoutWaitingForIt) {
  Stream stream;
  perf::Session session;
  const std::int64_t cycles = cycles_in_ms(20);
  std::int64_t closed_ns = 0;
  {
    perf::OpScope scope("spin");
    time_on_stream(scope, stream.get());
    MESHTEST_CUDA_CHECK(launch_spin(cycles, stream.get()));
  }
  closed_ns = perf::now_ns();
  const auto r = perf::records();  // waits for the kernel
  ASSERT_EQ(r.size(), 1u);
  const double ms = static_cast<double>(r[0].duration_ns()) / 1e6;
  // At least the cycles spun (the clock may run above its base rate, never below it for long),
  // and far from the host's few microseconds between opening and closing the scope.
  EXPECT_GE(ms, 10.0) << "the record did not take the kernel's time";
  EXPECT_LT(ms, 200.0);
  EXPECT_LT(closed_ns, r[0].end_ns) << "the scope waited for the kernel to end";
}

TEST(OpTimer, ConsecutiveOpsOnAStreamAreInOrderWithTheirLatency) {
  Stream stream;
  perf::Session session;
  const std::int64_t cycles = cycles_in_ms(2);
  for (int i = 0; i < 3; ++i) {
    perf::OpScope scope("spin");
    time_on_stream(scope, stream.get());
    MESHTEST_CUDA_CHECK(launch_spin(cycles, stream.get()));
  }
  const auto r = perf::records();
  ASSERT_EQ(r.size(), 3u);
  for (std::size_t i = 0; i < r.size(); ++i) {
    EXPECT_GE(r[i].duration_ns(), 1'000'000) << "op " << i;
    if (i > 0) {
      EXPECT_GE(r[i].start_ns, r[i - 1].end_ns) << "op " << i;
    }
  }
}

TEST(OpTimer, ALongRunReusesFinishedTimersEvents) {
  Stream stream;
  perf::Session session;
  const std::size_t before = timer_events_created(current_device());
  const std::int64_t cycles = cycles_in_ms(0.01);
  constexpr int kOps = 2000;
  for (int k = 0; k < kOps; ++k) {
    perf::OpScope scope("spin");
    time_on_stream(scope, stream.get());
    MESHTEST_CUDA_CHECK(launch_spin(cycles, stream.get()));
    if (k % 100 == 99) stream.synchronize();  // the timers so far have finished
  }
  const std::size_t made = timer_events_created(current_device()) - before;
  // Two per op without reuse; with it, about two per op between synchronizations at most.
  EXPECT_LE(made, 2u * 100 + 16) << "events created for " << kOps << " timed ops";
  const auto r = perf::records();
  ASSERT_EQ(r.size(), static_cast<std::size_t>(kOps));
  for (std::size_t k = 0; k < r.size(); ++k) {
    EXPECT_GT(r[k].duration_ns(), 0) << k;
    // One stream: in order, to the events' resolution (about half a microsecond) and the
    // rounding of float milliseconds since the anchor.
    if (k > 0) {
      EXPECT_GE(r[k].start_ns + 2000, r[k - 1].end_ns) << k;
    }
    EXPECT_TRUE(r[k].timed_on_device);
  }
}

TEST(OpTimer, NothingIsQueuedWhenTheProfilerIsOff) {
  Stream stream;
  perf::clear();
  ASSERT_FALSE(perf::enabled());
  {
    perf::OpScope scope("spin");
    time_on_stream(scope, stream.get());
  }
  EXPECT_TRUE(perf::records().empty());
}

}  // namespace
}  // namespace meshtest::gpu
