// What a test of GPU ranks includes, with meshtest::gpu_gtest_main as its main (which binds
// every rank to its GPU before the first test, or skips every test with the reason): the
// one-call checks of dist/testing/harness/expect.hpp on device tensors, the sharded GPU op
// against a single device (dist/testing/gpu_checks.hpp), and a test's needs beyond one GPU per
// rank, each in one line that skips the test on every rank with the reason.
//
//   TEST(MyOp, AcrossFourGpus) {
//     MESHTEST_REQUIRE_GPU_RANKS(4);   // skips below 4 ranks (one GPU each)
//     MESHTEST_REQUIRE_PEER_ACCESS();  // skips unless every pair of a node's GPUs has it
//     ...
//   }
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dist/gpu/ccl/rank_gpu.hpp"
#include "dist/testing/gpu_checks.hpp"
#include "dist/testing/harness/expect.hpp"
#include "dist/testing/harness/harness.hpp"
#include "src/gpu/device_tensor.hpp"

namespace meshtest::dist::testing {

/// within_model (expect.hpp) of a result on this rank's GPU.
inline ::testing::AssertionResult within_model(const meshtest::gpu::DeviceTensor& got,
                                               const HostReference& reference,
                                               const std::vector<Tensor>& inputs,
                                               const Terms& terms) {
  return within_model(got.to_host(), reference, inputs, terms);
}
inline ::testing::AssertionResult within_model(const meshtest::gpu::DeviceTensor& got,
                                               const Tensor& expected, const Terms& terms,
                                               double scale = -1) {
  return within_model(got.to_host(), expected, terms, scale);
}

/// Collective over MPI_COMM_WORLD on the first call, remembered after: why the ranks' GPUs
/// cannot reach each other peer to peer ("" when every pair on a node can).
inline const std::string& peer_access_problem() {
  static const std::string problem = gpu::gpu_peer_access_problem();
  return problem;
}

}  // namespace meshtest::dist::testing

/// Skips the running test (on every rank: the count is the job's) unless the job has at least
/// n ranks, each with a GPU of its own.
#define MESHTEST_REQUIRE_GPU_RANKS(n)                                                    \
  do {                                                                                   \
    const int meshtest_ranks_ = ::meshtest::dist::testing::world_size();                 \
    if (meshtest_ranks_ < (n)) {                                                         \
      GTEST_SKIP() << "needs " << (n) << " GPU ranks; this job has " << meshtest_ranks_; \
    }                                                                                    \
  } while (false)

/// Skips the running test on every rank unless every rank's GPU can access the GPUs of the
/// other ranks of its node peer to peer. Collective the first time: call it on every rank.
#define MESHTEST_REQUIRE_PEER_ACCESS()                                                       \
  do {                                                                                       \
    if (const std::string& meshtest_why_ = ::meshtest::dist::testing::peer_access_problem(); \
        !meshtest_why_.empty()) {                                                            \
      GTEST_SKIP() << "needs peer access between the GPUs: " << meshtest_why_;               \
    }                                                                                        \
  } while (false)
