// broadcast: the root's tensor to every device of an axis.
#pragma once

#include "dist/ccl/options.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Collective over the devices of `opt.axis` (same CCLs, same order on all).
/// Returns the root's x (shape and dtype included) on every device; x is
/// ignored on the other devices.
Tensor broadcast(const MeshDevice& mesh, const Tensor& x, const BroadcastOptions& opt = {});

}  // namespace meshtest::dist
