// all_reduce: element-wise reduction over the devices of an axis.
#pragma once

#include "dist/ccl/options.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Collective over the devices of `opt.axis` (same CCLs, same order on all).
/// x: the same shape and dtype on every device. Returns the reduction on every device.
Tensor all_reduce(const MeshDevice& mesh, const Tensor& x, const AllReduceOptions& opt = {});

/// In-place all_reduce: x is overwritten with the result.
void all_reduce_inplace(const MeshDevice& mesh, Tensor& x, const AllReduceOptions& opt = {});

}  // namespace meshtest::dist
