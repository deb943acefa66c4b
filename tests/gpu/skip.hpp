// skip: when a GPU test cannot run on this machine, and the exit code that tells CTest so.
#pragma once

#include <fmt/format.h>

#include <string>

#include "src/gpu/runtime.hpp"

namespace meshtest::gpu::testing {

/// The exit code of a test binary that skipped (CTest's SKIP_RETURN_CODE of the gpu tests).
inline constexpr int kSkipExitCode = 77;

/// Why a test needing `needed` GPUs in this process's view cannot run ("" when it can): no
/// GPU (with gpu::no_gpu_reason()), or fewer than needed.
inline std::string skip_reason(int needed) {
  const int n = device_count();
  if (n >= needed) return "";
  if (n == 0) return fmt::format("no GPU: {}", no_gpu_reason());
  return fmt::format("needs {} GPUs, this machine has {}", needed, n);
}

}  // namespace meshtest::gpu::testing
