// node_chain_path: the node chain as a path: all_reduce over a group whose nodes hold equal runs
// of consecutive axis indices (node_chain.hpp), when its mode takes it; it declines the rest.
#pragma once

#include "dist/ccl/path.hpp"

namespace meshtest::dist::detail {

/// The path (stateless: each call finds its communicator's NodeChain).
Path& node_chain_path();

}  // namespace meshtest::dist::detail
