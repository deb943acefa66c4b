// numerics: MESHTEST_GPU_REDUCE and the numerics option of a reduction.
#include "dist/ccl/numerics.hpp"

#include <cstdlib>
#include <optional>
#include <string>

#include "dist/ccl/detail.hpp"

namespace meshtest::dist::detail {
namespace {

constexpr const char* kGpuReduce = "MESHTEST_GPU_REDUCE";

/// MESHTEST_GPU_REDUCE's numerics: exact when unset or empty; nullopt for another value.
std::optional<Numerics> env_numerics() {
  const char* v = std::getenv(kGpuReduce);
  const std::string_view s = v != nullptr ? v : "";
  if (s.empty() || s == "exact") return Numerics::exact;
  if (s == "nccl") return Numerics::nccl;
  return std::nullopt;
}

std::string show_numerics(std::int64_t n) {
  return std::string(numerics_name(static_cast<Numerics>(n)));
}

}  // namespace

AgreedOption numerics_option(Call& call, Numerics n) {
  const bool host = call.memory().is_host();
  if (n == Numerics::from_env) {
    const std::optional<Numerics> env = env_numerics();
    if (!env && !host) {
      call.local_error("{} is '{}'; expected exact (the default) or nccl", kGpuReduce,
                       std::getenv(kGpuReduce));
    }
    n = env.value_or(Numerics::exact);
  } else if (n == Numerics::nccl && host) {
    call.local_error(
        "numerics nccl (NCCL's own reductions) is for tensors on a GPU, and x {} is in host "
        "memory, which every path reduces with the exact numerics",
        describe(call.input()));
  }
  return {"numerics (the option, or MESHTEST_GPU_REDUCE)", static_cast<std::int64_t>(n),
          &show_numerics};
}

}  // namespace meshtest::dist::detail
