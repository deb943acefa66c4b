// gpu_main: main() of the single-process GPU test binaries — GoogleTest, or exit 77 (skipped)
// with the reason when this machine has no GPU.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/gpu/skip.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const std::string why = meshtest::gpu::testing::skip_reason(1);
  if (!why.empty()) {
    std::printf("[  SKIPPED ] %s: %s\n", argv[0], why.c_str());
    return meshtest::gpu::testing::kSkipExitCode;
  }
  return RUN_ALL_TESTS();
}
