// The faults of mpi_tests/gpu/test_gpu_faults, run as child jobs (mpirun -np N gpu_fault_case
// --gtest_filter=GpuFault.<case>, N = 2 or 4): rank 1 fails while the other ranks wait inside an
// exact all_reduce or reduce_scatter on device buffers over the whole mesh (dist/gpu/ccl/exchange,
// then g.synchronize()). Each collective runs inside a CclLogScope, as the CCL front ends run
// theirs, so that the harness's report names the one the others wait in. Every rank prints what
// fault_step.hpp says (reaching the faulty step, running its job-end hooks), and a rank whose
// collective ends in an error prints "[fault] rank r left the collective: <error>" (how the
// job-end hook's ncclCommAbort released it) before the error propagates. Skips every test, with
// the reason, where a rank has no GPU of its own.
#include <gtest/gtest.h>
#include <signal.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <stdexcept>
#include <vector>

#include "dist/ccl/ccl_log.hpp"
#include "dist/gpu/ccl/exchange.hpp"
#include "dist/testing/gpu/gpu_test.hpp"
#include "mpi_tests/gpu/gpu_fault_kernels.hpp"
#include "mpi_tests/harness_cases/fault_step.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::dist::gpu {
namespace {

using meshtest::gpu::DeviceTensor;

constexpr int kFaulty = 1;
/// Elements of every device's input: 256 KiB of f32, divisible by every rank count.
constexpr std::int64_t kElements = 1 << 16;

/// Every rank says in its log when it runs its job-end hooks.
const bool g_printing_job_end = harness_cases::add_print_job_end();

enum class Op { all_reduce, reduce_scatter };

/// How the ranks that wait for rank 1 wait for their collective to finish.
enum class Wait {
  poll,   ///< g.synchronize(): polling, which an abort interrupts
  block,  ///< cudaFree, then cudaStreamSynchronize: blocked in the CUDA runtime behind the stuck
          ///< NCCL kernel, until ncclCommAbort makes it exit or the process is killed
};

const char* name_of(Op op) { return op == Op::all_reduce ? "all_reduce" : "reduce_scatter"; }

/// One exact sum of every device's x over `g`, in place, finished: all_reduce, or reduce_scatter
/// into this device's own block of x.
void collective(NcclGroup& g, Op op, DeviceTensor& x, Wait wait = Wait::poll) {
  static constexpr std::array<LogField, 3> kFields = {
      LogField{.key = "op", .text = "sum"}, LogField{.key = "memory", .text = "cuda"},
      LogField{.key = "axis", .value = kAllAxes, .text = "all"}};
  CclLogScope scope(name_of(op), x.shape(), x.dtype(), kFields);
  const std::int64_t n = x.numel();
  if (op == Op::all_reduce) {
    all_reduce(g, x.bytes(), x.bytes(), n, DType::f32, Reduce::sum);
  } else {
    const std::int64_t block = n / g.size();
    const std::vector<std::int64_t> counts(static_cast<std::size_t>(g.size()), block);
    const auto own = static_cast<std::size_t>(g.index() * block) * sizeof(float);
    reduce_scatter(g, x.bytes(), counts, x.bytes() + own, DType::f32, Reduce::sum);
  }
  if (wait == Wait::block) {
    { const DeviceTensor scratch(Shape{1}, DType::f32); }  // cudaFree waits for the device
    MESHTEST_CUDA_CHECK(cudaStreamSynchronize(g.stream()));
  }
  g.synchronize(name_of(op));
}

class GpuFault : public ::testing::Test {
 protected:
  void SetUp() override {
    mesh_.emplace(MeshDevice::line());
    x_ = DeviceTensor(Shape{kElements}, DType::f32);  // on this rank's GPU, bound above
  }
  void TearDown() override {
    x_ = DeviceTensor();
    mesh_.reset();
  }

  NcclGroup& group() { return MeshNccl::of(*mesh_).group(kAllAxes); }
  bool faulty() const { return mesh_->device_id() == kFaulty; }

  /// Two collectives that go well (NCCL's connections up), so that the faulty step's is #3, then
  /// the faulty step's announcement.
  void warm_up_and_reach(Op op) {
    for (int i = 0; i < 2; ++i) collective(group(), op, x_);
    harness_cases::print_reach();
  }

  /// The other ranks' side of the faulty step: the collective that rank 1 never joins; what ends
  /// it printed to the rank's log before it propagates.
  void wait_for_rank_1(Op op, Wait wait = Wait::poll) {
    try {
      collective(group(), op, x_, wait);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[fault] rank %d left the collective: %s\n", mesh_->device_id(),
                   e.what());
      std::fflush(stderr);
      throw;
    }
  }

  /// Rank 1 queues `kernel` on the group's stream (where its collective would run) and waits
  /// for it: the kernel faults, and the wait throws the CUDA error naming `what`.
  void run_faulty_kernel(cudaError_t (*launch)(cudaStream_t), const char* what) {
    NcclGroup& g = group();
    MESHTEST_CUDA_CHECK(launch(g.stream()));
    g.synchronize(what);
    FAIL() << what << " finished without an error";
  }

  std::optional<MeshDevice> mesh_;
  DeviceTensor x_;
};

TEST_F(GpuFault, Throw) {
  warm_up_and_reach(Op::all_reduce);
  if (faulty()) throw std::runtime_error("rank 1 throws");
  wait_for_rank_1(Op::all_reduce);
}

TEST_F(GpuFault, Assert) {
  warm_up_and_reach(Op::reduce_scatter);
  if (faulty()) {
    ASSERT_EQ(world_rank_or_minus_one(), 0) << "rank 1 fails an ASSERT";
  }
  wait_for_rank_1(Op::reduce_scatter);
}

TEST_F(GpuFault, Exit) {
  warm_up_and_reach(Op::all_reduce);
  if (faulty()) std::exit(3);
  wait_for_rank_1(Op::all_reduce);
}

TEST_F(GpuFault, SigKill) {
  warm_up_and_reach(Op::reduce_scatter);
  if (faulty()) ::raise(SIGKILL);
  wait_for_rank_1(Op::reduce_scatter);
}

TEST_F(GpuFault, IllegalAddress) {
  warm_up_and_reach(Op::all_reduce);
  if (faulty()) {
    run_faulty_kernel(
        [](cudaStream_t s) { return gpu_fault_case::launch_write_through(nullptr, s); },
        "rank 1's kernel that writes through a null pointer");
    return;
  }
  wait_for_rank_1(Op::all_reduce);
}

TEST_F(GpuFault, LaunchFailure) {
  warm_up_and_reach(Op::reduce_scatter);
  if (faulty()) {
    run_faulty_kernel(&gpu_fault_case::launch_trap, "rank 1's kernel that traps");
    return;
  }
  wait_for_rank_1(Op::reduce_scatter);
}

TEST_F(GpuFault, OthersBlockInCuda) {
  warm_up_and_reach(Op::all_reduce);
  if (faulty()) throw std::runtime_error("rank 1 throws while the others block in CUDA calls");
  wait_for_rank_1(Op::all_reduce, Wait::block);
}

}  // namespace
}  // namespace meshtest::dist::gpu
