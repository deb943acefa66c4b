// choose: the order of the paths per call, the device path's slot, and the agreed path settings
// (all_reduce's node chain, the numerics of a reduction).
#include "dist/ccl/paths/choose.hpp"

#include <cstdlib>
#include <optional>
#include <string>

#include "dist/ccl/paths/mpi/mpi_path.hpp"
#include "dist/ccl/paths/node_chain/node_chain.hpp"
#include "dist/ccl/paths/node_chain/node_chain_path.hpp"
#include "dist/ccl/paths/shm/shm_path.hpp"

namespace meshtest::dist::detail {
namespace {

Path*& device_path() {
  static Path* path = nullptr;
  return path;
}

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

PathOrder::PathOrder(std::initializer_list<Path*> paths) {
  MESHTEST_DIST_CHECK(paths.size() <= paths_.size(), "PathOrder: {} paths, at most {}",
                      paths.size(), paths_.size());
  for (Path* p : paths) paths_[n_++] = p;
}

PathOrder choose_paths(const Call& call) {
  if (!call.memory().is_host()) {
    Path* device = device_path();
    if (device == nullptr) {
      call.fail(
          "a tensor in {} memory needs the GPU path, and none is installed (the GPU side of "
          "meshtest installs it; the shared-memory, node-chain and MPI paths move host memory "
          "only)",
          kind_name(call.memory()));
    }
    return {device};
  }
  if (call.shm() != nullptr) return {&shm_path(), &mpi_path()};
  return {&node_chain_path(), &mpi_path()};
}

Path* set_device_path(Path* path) { return std::exchange(device_path(), path); }

AgreedOption all_reduce_path_option() {
  return {"node chain (MESHTEST_CCL_NODE_CHAIN)", static_cast<std::int64_t>(NodeChain::mode()),
          &NodeChain::show_mode};
}

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

void no_path(const Call& call) {
  call.fail("no path moves this call's data (operand in {} memory)", kind_name(call.memory()));
}

}  // namespace meshtest::dist::detail
