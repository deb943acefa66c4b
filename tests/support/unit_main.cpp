// main() of the single-process test binaries: GoogleTest after MESHTEST_EIGEN_CACHE is applied.
#include <gtest/gtest.h>

#include <cstdio>
#include <exception>

#include "src/core/eigen_cache.hpp"

int main(int argc, char** argv) {
  try {
    if (const auto cache = meshtest::apply_eigen_cache_env()) {
      std::printf("[meshtest] Eigen's GEMM blocking as for caches of %s (MESHTEST_EIGEN_CACHE)\n",
                  cache->str().c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
