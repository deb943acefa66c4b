// tune_malloc_for_collectives: glibc mallopt settings, applied only when a program asks.
#include "dist/ccl/malloc_tuning.hpp"

#include <malloc.h>

#include <cstdlib>
#include <string_view>

namespace meshtest::dist {

bool tune_malloc_for_collectives() {
  const char* env = std::getenv("MESHTEST_MALLOC_TUNING");
  if (env != nullptr && std::string_view(env) == "0") return false;
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  return true;
}

}  // namespace meshtest::dist
