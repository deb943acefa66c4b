// meshtest::gpu_gtest_main's main(): the harness (dist/testing/harness/harness.hpp) with every
// rank bound to a GPU of its own before the first test; where some rank cannot have one (no GPU,
// no driver, more ranks on a node than GPUs), every test skips on every rank with the reason.
#include <string>

#include "dist/gpu/ccl/rank_gpu.hpp"
#include "dist/testing/harness/harness.hpp"

int main(int argc, char** argv) {
  return meshtest::dist::testing::run_all_tests(argc, argv, [] {
    const std::string problem = meshtest::dist::gpu::gpu_binding_problem();  // agreed
    if (!problem.empty()) return "GPU ranks unavailable: " + problem;
    meshtest::dist::gpu::bind_rank_to_gpu();
    return std::string();
  });
}
