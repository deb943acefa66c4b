// The fixture of the MPI tests that need a GPU per rank: every test skips on every rank together,
// with the reason, where some rank has none; and the message of an expected Error.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "dist/gpu/ccl/rank_gpu.hpp"
#include "dist/testing/harness/harness.hpp"
#include "src/core/error.hpp"

namespace meshtest::dist::gpu {

/// Skips with "GPU ranks unavailable: <gpu_binding_problem()>" (the text CTest's
/// SKIP_REGULAR_EXPRESSION of mpi_tests/gpu matches) unless every rank has a GPU of its own;
/// else binds this rank to it. The problem is agreed once per process, in the first test.
class GpuRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static const std::string problem = gpu_binding_problem();  // collective, the same everywhere
    if (!problem.empty()) GTEST_SKIP() << "GPU ranks unavailable: " << problem;
    bind_rank_to_gpu();
  }
  void TearDown() override { testing::test_body_done(); }
};

/// The message of the meshtest::Error that f throws, without its "[rank r] " prefix; "" when f
/// returns.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (!msg.starts_with("[rank ")) return msg;  // single-GPU errors carry no rank
    return msg.substr(std::min(msg.size(), msg.find("] ") + 2));
  }
  return {};
}

}  // namespace meshtest::dist::gpu
