// all_gather: concatenate every device's tensor along a dim, in axis order.
// Its path (shared memory when the group is on one node, else MPI, also across nodes) is
// chosen per communicator as dist/ccl/ccl.hpp says.
#pragma once

#include "dist/ccl/options.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Collective over the devices of `opt.axis`: every device of the axis group
/// calls it, and all devices call the same CCLs in the same order.
/// x: [..., n_i, ...] on device i (n_i may differ, e.g. array_split shards;
/// all other dims and the dtype must agree). Returns [..., sum_i n_i, ...],
/// the pieces concatenated along opt.dim in axis order, on every device. Empty pieces
/// (n_i = 0) are fine. Agrees on the call (detail::Call: one shared-memory step or one small
/// MPI_Allreduce; the per-device sizes are gathered only when pieces differ), then, for even
/// pieces on one node, the shared-memory ring (detail::ShmGroup; along a non-leading dim the
/// pieces are unpacked straight from the slots into place), else MPI_Allgather (even pieces)
/// or MPI_Allgatherv on contiguous buffers (a non-leading dim is gathered end to end and
/// unpacked: no derived datatypes, so no MPI algorithm choice can change the result).
/// Throws meshtest::Error, the same on every device of the group (never a hang), when:
/// opt.axis is not 0, 1 or kAllAxes (thrown locally, before any communication); opt.dim is
/// out of range [-rank, rank) on any device; devices disagree on opt.dim; dtypes differ;
/// shapes differ outside opt.dim; on the MPI path, the output exceeds INT_MAX elements.
Tensor all_gather(const MeshDevice& mesh, const Tensor& x, const AllGatherOptions& opt = {});

namespace all_gather_bw {
/// nccl-tests bus bandwidth factor over n devices: busbw = algbw * (n-1)/n, with
/// algbw = S / t and S the bytes of the gathered output.
double bus_factor(int n);
}  // namespace all_gather_bw

}  // namespace meshtest::dist
