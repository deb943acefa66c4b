// reduce_scatter: reduce over the axis, device i keeps slice i along a dim.
#pragma once

#include "dist/ccl/options.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Collective over the devices of `opt.axis` (same CCLs, same order on all).
/// x: the same shape [..., n, ...] and dtype on every device. Returns the
/// element-wise reduction's slice i along opt.dim on the device with axis
/// index i: [..., n_i, ...] with n_i by the array_split rule (n % p first
/// devices get ceil(n/p)); n < p gives some devices an empty slice. Agrees on the call
/// (see detail::Call). Equal blocks (p divides n) on one node go through the shared-memory
/// ring (detail::ShmGroup; a non-leading dim is packed first): device i reads block i of every
/// device's input and reduces x_0 op x_1 op ... op x_{p-1} in axis order. Otherwise it sends
/// each block straight to its device (MPI_Isend / MPI_Irecv) and reduces locally with
/// MPI_Reduce_local (both far faster than Open MPI's MPI_Reduce_scatter on one node);
/// workspaces are planned once per signature. avg = sum, then / p; bf16 reduces in f32 and rounds
/// to bf16. Throws meshtest::Error, the same on every device of the group (never a hang), for: a
/// bad axis (locally) or dim; devices disagreeing on dim or op, on the dtype or on the shape; avg
/// on an integer dtype or any op on u8 ("reduce op X is not supported for dtype Y"); an input
/// beyond INT_MAX elements.
///
/// Summation order (deterministic: the same inputs give the same bits on every run and at
/// every plan-cache state): on the shared-memory ring x_0 (op) x_1 (op) ... (op) x_{p-1};
/// on the MPI path device i reduces its block as
/// x_{i+1} (op) x_i, then (op) x_{i+2}, ..., (op) x_{i-1} (indices mod p, left to right). For
/// integers, max and min this equals any other order; for floating-point sums it is not
/// necessarily bit-equal to all_reduce followed by slicing (MPI_Allreduce may add in another
/// order), only equal within rounding. Its messages use a private duplicate of the axis
/// communicator, so they never match receives user code posts on mesh.comm().
Tensor reduce_scatter(const MeshDevice& mesh, const Tensor& x,
                      const ReduceScatterOptions& opt = {});

namespace reduce_scatter_bw {
/// nccl-tests bus bandwidth factor over n devices: busbw = algbw * (n-1)/n, with
/// algbw = S / t and S the bytes of the whole input.
double bus_factor(int n);
}  // namespace reduce_scatter_bw

}  // namespace meshtest::dist
