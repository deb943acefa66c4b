// all_gather: concatenate every device's tensor along a dim, in axis order.
#pragma once

#include "dist/ccl/options.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Collective over the devices of `opt.axis`: every device of the axis group
/// calls it, and all devices call the same CCLs in the same order.
/// x: [..., n_i, ...] on device i (n_i may differ, e.g. array_split shards;
/// all other dims and the dtype must agree). Returns [..., sum_i n_i, ...],
/// the pieces concatenated along opt.dim in axis order, on every device.
Tensor all_gather(const MeshDevice& mesh, const Tensor& x, const AllGatherOptions& opt = {});

}  // namespace meshtest::dist
