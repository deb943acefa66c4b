// gpu::time_on_stream, with either timer (CUPTI's activity records, CUDA events): an op's record
// takes the kernel's time, not the host's (the scope closes long before a 20 ms kernel ends:
// timing does not serialize the stream), resolved when the records are read; consecutive ops on
// one stream in order; a long run reuses the events of finished timers; nothing when the
// profiler is off. CUPTI's record is the op's own kernels, not the wait for earlier work on the
// stream that the events include; an op that queued nothing takes the host's times; a bad
// MESHTEST_GPU_TIMER is an Error.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "src/gpu/op_timer.hpp"
#include "src/gpu/runtime.hpp"
#include "src/perf/profiler.hpp"
#include "tests/gpu/spin_kernel.hpp"

namespace meshtest::gpu {
namespace {

using testing::launch_spin;

/// Each test with either timer; CUPTI's skipped, with the reason, where it does not start.
class OpTimer : public ::testing::TestWithParam<GpuTimer> {
 protected:
  void SetUp() override {
    set_gpu_timer(GetParam());
    if (GetParam() == GpuTimer::cupti && !cupti_problem().empty()) {
      GTEST_SKIP() << "CUPTI does not time the ops here: " << cupti_problem();
    }
    ASSERT_EQ(gpu_timer(), GetParam());
  }
};

std::string timer_name(const ::testing::TestParamInfo<GpuTimer>& p) {
  return p.param == GpuTimer::cupti ? "cupti" : "events";
}

/// SM clock cycles in `ms` milliseconds on the current device.
std::int64_t cycles_in_ms(double ms) {
  int khz = 0;
  MESHTEST_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, current_device()));
  return static_cast<std::int64_t>(ms * khz);
}

TEST_P(OpTimer, TheRecordTakesTheKernelsTimeWithoutWaitingForIt) {
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

TEST_P(OpTimer, ConsecutiveOpsOnAStreamAreInOrderWithTheirLatency) {
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

TEST_P(OpTimer, ALongRunReusesFinishedTimersEvents) {
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

TEST_P(OpTimer, NothingIsQueuedWhenTheProfilerIsOff) {
  Stream stream;
  perf::clear();
  ASSERT_FALSE(perf::enabled());
  {
    perf::OpScope scope("spin");
    time_on_stream(scope, stream.get());
  }
  EXPECT_TRUE(perf::records().empty());
}

INSTANTIATE_TEST_SUITE_P(Timers, OpTimer, ::testing::Values(GpuTimer::cupti, GpuTimer::events),
                         timer_name);

TEST(OpTimerCupti, TheRecordIsTheOpsKernelsNotTheHostsGapBeforeThem) {
  // A 2 ms kernel launched 10 ms after the scope was timed, on an idle stream: the events'
  // start completes at once, so their record spans the host's 10 ms as well; CUPTI's spans the
  // kernel alone.
  set_gpu_timer(GpuTimer::cupti);
  if (!cupti_problem().empty())
    GTEST_SKIP() << "CUPTI does not time the ops here: " << cupti_problem();
  Stream stream;
  const auto timed = [&](GpuTimer timer) {
    set_gpu_timer(timer);
    perf::Session session;
    {
      perf::OpScope scope("spin");
      time_on_stream(scope, stream.get());
      const std::int64_t until = perf::now_ns() + 10'000'000;
      while (perf::now_ns() < until) {
      }
      MESHTEST_CUDA_CHECK(launch_spin(cycles_in_ms(2), stream.get()));
    }
    const auto r = perf::records();
    EXPECT_EQ(r.size(), 1u);
    return r.empty() ? 0.0 : static_cast<double>(r[0].duration_ns()) / 1e6;
  };
  const double cupti_ms = timed(GpuTimer::cupti), events_ms = timed(GpuTimer::events);
  EXPECT_GE(cupti_ms, 1.0);
  EXPECT_LT(cupti_ms, 8.0) << "CUPTI's record took the host's gap before the kernel";
  EXPECT_GE(events_ms, 11.0) << "the events' record should span the host's gap";
  set_gpu_timer(GpuTimer::cupti);
}

TEST(OpTimerCupti, AnOpThatQueuesNothingTakesTheHostsTimes) {
  set_gpu_timer(GpuTimer::cupti);
  if (!cupti_problem().empty())
    GTEST_SKIP() << "CUPTI does not time the ops here: " << cupti_problem();
  Stream stream;
  perf::Session session;
  const std::int64_t before = perf::now_ns();
  {
    perf::OpScope scope("nothing");
    time_on_stream(scope, stream.get());
  }
  const auto r = perf::records();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].duration_ns(), 0);
  EXPECT_GE(r[0].start_ns, before);
  EXPECT_LE(r[0].start_ns, perf::now_ns());
}

TEST(OpTimerCupti, ABadTimerNameIsAnError) {
  ASSERT_EQ(setenv("MESHTEST_GPU_TIMER", "nvtx", 1), 0);
  set_gpu_timer(std::nullopt);  // the environment decides
  try {
    (void)gpu_timer();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MESHTEST_GPU_TIMER is 'nvtx': cupti or events expected"),
              std::string::npos)
        << e.what();
  }
  ASSERT_EQ(setenv("MESHTEST_GPU_TIMER", "events", 1), 0);
  EXPECT_EQ(gpu_timer(), GpuTimer::events);
  ASSERT_EQ(unsetenv("MESHTEST_GPU_TIMER"), 0);
  EXPECT_EQ(gpu_timer(), cupti_problem().empty() ? GpuTimer::cupti : GpuTimer::events);
}

}  // namespace
}  // namespace meshtest::gpu
