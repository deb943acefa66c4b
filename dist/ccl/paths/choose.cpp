// choose: the order of the paths per call, the device path's slot, and all_reduce's agreed path
// setting.
#include "dist/ccl/paths/choose.hpp"

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

void no_path(const Call& call) {
  call.fail("no path moves this call's data (operand in {} memory)", kind_name(call.memory()));
}

}  // namespace meshtest::dist::detail
