// reduce_scatter: reduce over the axis, device i keeps slice i along a dim.
// Its path (shared memory when the group is on one node, else MPI, also across nodes) is
// chosen per communicator as dist/ccl/ccl.hpp says.
#pragma once

#include "dist/ccl/options.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Collective over the devices of `opt.axis` (same CCLs, same order on all).
/// x: the same shape [..., n, ...] and dtype on every device. Returns the
/// element-wise reduction's slice i along opt.dim on the device with axis
/// index i: [..., n_i, ...] with n_i by the array_split rule (n % p first
/// devices get ceil(n/p)); n < p gives some devices an empty slice.
///
/// Reduction rule (every path, detail::reduce): x_0 op x_1 op ... op x_{p-1} in axis order;
/// bf16 and f16 accumulate all p terms in f32 and round once (avg divides in f32 first). So the
/// result is bit-equal to all_reduce followed by the slice, on either path, at every
/// plan-cache state.
///
/// Algorithm: agree on the call (see detail::Call). Equal blocks (p divides n) on one node go
/// through the shared-memory window (detail::ShmGroup; a non-leading dim is packed first):
/// device i reads block i of every other device's input and reduces. Otherwise each block
/// goes straight to its device (MPI_Isend / MPI_Irecv on a private duplicate of the axis
/// communicator, so the messages never match receives user code posts on mesh.comm()), which
/// reduces locally (both far faster than Open MPI's MPI_Reduce_scatter on one node).
/// Workspaces are planned once per signature. Throws meshtest::Error, the same on every device
/// of the group (never a hang), for: a bad axis (locally) or dim; devices disagreeing on dim,
/// op or numerics, on the dtype or on the shape; avg on an integer dtype or any op on u8
/// ("reduce op X is not supported for dtype Y"); opt.numerics nccl (NCCL's arithmetic is for
/// tensors on a GPU: dist/gpu/ccl/ccl.hpp); on the MPI path, an input beyond INT_MAX elements.
Tensor reduce_scatter(const MeshDevice& mesh, const Tensor& x,
                      const ReduceScatterOptions& opt = {});

namespace reduce_scatter_bw {
/// nccl-tests bus bandwidth factor over n devices: busbw = algbw * (n-1)/n, with
/// algbw = S / t and S the bytes of the whole input.
double bus_factor(int n);
}  // namespace reduce_scatter_bw

}  // namespace meshtest::dist
