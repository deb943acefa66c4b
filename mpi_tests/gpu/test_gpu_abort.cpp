// The fault path of GPU ranks (dist/gpu/ccl/nccl_calls): a rank waiting inside an exchange whose
// peer never comes is released by the abort hook (abort_all_nccl from another thread, as the
// harness's watchdog calls it) within the hook's limit, with an Error naming the reason; after
// it every NCCL use throws instead of waiting. The abort is for the whole process, so this binary
// holds only these tests, in this order. Skips every test, with the reason, where a rank has no
// GPU of its own; needs 2 ranks or more.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <string>
#include <thread>

#include "dist/gpu/ccl/exchange.hpp"
#include "dist/testing/gpu/gpu_test.hpp"
#include "src/gpu/device_tensor.hpp"

namespace meshtest::dist::gpu {
namespace {

using meshtest::gpu::DeviceTensor;
using testing::error_message_of;
using Clock = std::chrono::steady_clock;

const MeshDevice& line() {
  static const MeshDevice mesh = MeshDevice::line();
  return mesh;
}

TEST(GpuAbort, HookReleasesARankWaitingForAPeerThatNeverComes) {
  MESHTEST_REQUIRE_GPU_RANKS(2);  // a rank waits for a peer
  MESHTEST_TIMEOUT(60);
  const MeshDevice& mesh = line();
  NcclGroup& g = MeshNccl::of(mesh).group(kAllAxes);
  const int n = 1 << 20;
  DeviceTensor x(Shape{n}, DType::f32);
  all_reduce(g, x.bytes(), x.bytes(), n, DType::f32, Reduce::sum);  // every rank: connections up
  g.synchronize("the warm-up");
  if (mesh.device_id() != 0) {
    // Device 0 never joins this all_reduce; the watchdog aborts after 1 s.
    std::thread watchdog([] {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      abort_all_nccl("the test's watchdog", std::chrono::seconds(10));
    });
    const auto start = Clock::now();
    const std::string err = error_message_of([&] {
      all_reduce(g, x.bytes(), x.bytes(), n, DType::f32, Reduce::sum);
      g.synchronize("the all_reduce device 0 skipped");
    });
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    watchdog.join();
    EXPECT_NE(err.find("NCCL communicators aborted (the test's watchdog)"), std::string::npos)
        << err;
    EXPECT_LT(waited, 11.0) << "the abort released the wait only after " << waited << " s";
    EXPECT_TRUE(g.broken());
  }
  // Device 0 gave up on nothing: its communicator waits for peers that aborted, so it aborts too.
  MPI_Barrier(MPI_COMM_WORLD);
  if (mesh.device_id() == 0) {
    EXPECT_TRUE(abort_all_nccl("the test's end"));
  }
  EXPECT_EQ(live_nccl_comms(), 0U);
  EXPECT_TRUE(nccl_abort_reason().has_value());
}

TEST(GpuAbort, AfterTheAbortEveryNcclUseThrows) {
  MESHTEST_REQUIRE_GPU_RANKS(2);
  const std::string reason = nccl_abort_reason().value_or("");
  ASSERT_FALSE(reason.empty()) << "the test before this one aborts";
  NcclGroup& g = MeshNccl::of(line()).group(kAllAxes);
  DeviceTensor x(Shape{8}, DType::f32);
  const std::string queued =
      error_message_of([&] { all_reduce(g, x.bytes(), x.bytes(), 8, DType::f32, Reduce::max); });
  EXPECT_NE(
      queued.find("NCCL communicators aborted (" + reason + ") before reduce_scatter (exact)"),
      std::string::npos)
      << queued;
  const std::string waited = error_message_of([&] { g.synchronize("a wait"); });
  EXPECT_NE(waited.find("aborted (" + reason + ")"), std::string::npos) << waited;
  // A new mesh cannot make communicators either; every device throws the same Error.
  const MeshDevice other = MeshDevice::line();
  const std::string made = error_message_of([&] { MeshNccl::of(other); });
  EXPECT_NE(made.find("before ncclGetUniqueId"), std::string::npos) << made;
}

}  // namespace
}  // namespace meshtest::dist::gpu
