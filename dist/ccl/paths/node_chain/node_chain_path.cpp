// node_chain_path: all_reduce of a group spanning nodes through the communicator's NodeChain,
// made at the first call that may take it; the chain's mode (MESHTEST_CCL_NODE_CHAIN) is agreed
// with every all_reduce, as every device must take the same path.
#include <fmt/format.h>

#include <string>

#include "dist/ccl/detail.hpp"
#include "dist/ccl/path_registry.hpp"
#include "dist/ccl/paths/node_chain/node_chain.hpp"
#include "dist/ccl/paths/shm/shm.hpp"

namespace meshtest::dist::detail {
namespace {

class NodeChainPath final : public Path {
 public:
  const PathInfo& info() const override {
    static constexpr PathInfo kInfo{
        .name = "node_chain", .memory = Memory::Kind::host, .reach = Reach::any, .priority = 200};
    return kInfo;
  }
  /// Groups without a shared-memory group of their own: spanning nodes (or with it off).
  bool applies(const Call& call) const override {
    return call.size() > 1 && ShmGroup::find(call.comm()) == nullptr;
  }
  void agreed_options(std::string_view op, AgreedOptions& out) const override {
    if (op.starts_with("all_reduce")) {
      out.add({"node chain (MESHTEST_CCL_NODE_CHAIN)", static_cast<std::int64_t>(NodeChain::mode()),
               &NodeChain::show_mode});
    }
  }

  std::string status(MPI_Comm comm) const override {
    const NodeChain* chain = NodeChain::find(comm);
    if (chain == nullptr) return {};
    const NodeChain::Mode mode = NodeChain::mode();
    return fmt::format(
        "all_reduce {} the node chain of {} nodes of {} (shared memory within a node, MPI "
        "between; MESHTEST_CCL_NODE_CHAIN={})",
        chain->taken(mode) ? "over" : "not over", chain->nodes(), chain->per_node(),
        NodeChain::show_mode(static_cast<std::int64_t>(mode)));
  }

  bool all_reduce(Call& call, const AllReduceExchange& x) override {
    const NodeChain::Mode mode = NodeChain::mode();  // agreed (agreed_options)
    if (mode == NodeChain::Mode::off || call.size() <= 1) return false;
    NodeChain* chain = NodeChain::establish(call.comm());  // collective the first time
    if (chain == nullptr || !chain->taken(mode)) return false;
    call.perf().attr("path", "node chain");
    call.run([chain, in = x.in, out = x.out, n = x.n, t = x.t, op = x.op] {
      chain->all_reduce(in, out, n, t, op);
    });
    return true;
  }
};

}  // namespace

void install_node_chain_path() {
  static NodeChainPath path;
  register_path(path);
}

}  // namespace meshtest::dist::detail
