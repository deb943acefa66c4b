// reduce_scatter: reduce over the axis, device i keeps slice i along a dim.
#pragma once

#include "dist/ccl/options.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Collective over the devices of `opt.axis` (same CCLs, same order on all).
/// x: the same shape [..., n, ...] and dtype on every device. Returns the
/// element-wise reduction's slice i along opt.dim on the device with axis
/// index i: [..., n_i, ...] with n_i by the array_split rule (n % p first
/// devices get ceil(n/p)).
Tensor reduce_scatter(const MeshDevice& mesh, const Tensor& x,
                      const ReduceScatterOptions& opt = {});

}  // namespace meshtest::dist
