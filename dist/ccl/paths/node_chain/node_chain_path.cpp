// node_chain_path: all_reduce through the communicator's NodeChain, made at the first call that
// may take it.
#include "dist/ccl/paths/node_chain/node_chain_path.hpp"

#include "dist/ccl/detail.hpp"
#include "dist/ccl/paths/node_chain/node_chain.hpp"

namespace meshtest::dist::detail {
namespace {

class NodeChainPath final : public Path {
 public:
  PathKind kind() const override { return PathKind::node_chain; }

  bool all_reduce(Call& call, const AllReduceExchange& x) override {
    const auto mode = static_cast<NodeChain::Mode>(x.node_chain_mode);
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

Path& node_chain_path() {
  static NodeChainPath path;
  return path;
}

}  // namespace meshtest::dist::detail
