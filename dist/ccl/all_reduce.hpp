// all_reduce: element-wise reduction over the devices of an axis.
// Its path (shared memory when the group is on one node; across nodes MPI, or the node chain
// of paths/node_chain/node_chain.hpp) is chosen per communicator as dist/ccl/ccl.hpp says.
#pragma once

#include "dist/ccl/options.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Collective over the devices of `opt.axis` (same CCLs, same order on all).
/// x: the same shape and dtype on every device. Returns the reduction on every device; u8
/// cannot be reduced, avg needs a floating dtype.
///
/// Reduction rule (every path, detail::reduce): element k is x_0[k] op x_1[k] op ... op
/// x_{p-1}[k] in axis order, computed once on one device and copied to the others, so every
/// device gets the same bits, and both paths give the same bits. bf16 and f16 accumulate all p
/// terms in f32 and round once at the end (avg divides in f32 before that rounding), never once
/// per addition.
///
/// Algorithm: agree on the call (detail::Call: one shared-memory step or one small
/// MPI_Allreduce), then a reduce-scatter (device i reduces part i) and an all-gather of the
/// reduced parts: inside the shared-memory window when the group is on one node
/// (detail::ShmGroup, pipelined chunk by chunk), else by point-to-point messages and
/// MPI_Allgatherv. Each device sends and receives 2(p-1)/p of x, the ring minimum, however
/// large p is. A group on several nodes whose layout allows it chains the nodes instead
/// (detail::NodeChain: same bits, 1/q of x across nodes per device). Throws
/// meshtest::Error, the same on every device of the group (never a hang), for: a bad axis
/// (locally); devices disagreeing on op, dtype, shape, numerics or MESHTEST_CCL_NODE_CHAIN; an
/// unsupported op for the dtype ("reduce op X is not supported for dtype Y"); opt.numerics
/// nccl (NCCL's arithmetic is for tensors on a GPU: dist/gpu/ccl/ccl.hpp); on the MPI path, more
/// than INT_MAX elements.
Tensor all_reduce(const MeshDevice& mesh, const Tensor& x, const AllReduceOptions& opt = {});

/// In-place all_reduce: x is overwritten with the result. Same contract.
void all_reduce_inplace(const MeshDevice& mesh, Tensor& x, const AllReduceOptions& opt = {});

namespace all_reduce_bw {
/// nccl-tests bus bandwidth factor over n devices: busbw = algbw * 2(n-1)/n, with
/// algbw = S / t and S the bytes of the vector.
double bus_factor(int n);
}  // namespace all_reduce_bw

}  // namespace meshtest::dist
