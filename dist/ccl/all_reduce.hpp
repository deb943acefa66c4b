// all_reduce: element-wise reduction over the devices of an axis.
#pragma once

#include "dist/ccl/options.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Collective over the devices of `opt.axis` (same CCLs, same order on all).
/// x: the same shape and dtype on every device. Returns the reduction on every device.
/// avg = sum, then / p (floating dtypes only); bf16 reduces in f32 and rounds to bf16; u8
/// cannot be reduced. Agrees on the call (detail::Call: one shared-memory step or one small
/// MPI_Allreduce), then reduces through the shared-memory ring when the group is on one node
/// (detail::ShmGroup: x_0 op x_1 op ... in axis order, the same bits on every device), else
/// MPI_Allreduce. Throws
/// meshtest::Error, the same on every device of the group (never a hang), for: a bad axis
/// (locally); devices disagreeing on op, dtype or shape; an unsupported op for the dtype
/// ("reduce op X is not supported for dtype Y"); more than INT_MAX elements.
Tensor all_reduce(const MeshDevice& mesh, const Tensor& x, const AllReduceOptions& opt = {});

/// In-place all_reduce (MPI_IN_PLACE): x is overwritten with the result. Same contract.
void all_reduce_inplace(const MeshDevice& mesh, Tensor& x, const AllReduceOptions& opt = {});

namespace all_reduce_bw {
/// nccl-tests bus bandwidth factor over n devices: busbw = algbw * 2(n-1)/n, with
/// algbw = S / t and S the bytes of the vector.
double bus_factor(int n);
}  // namespace all_reduce_bw

}  // namespace meshtest::dist
