// broadcast: the root's tensor to every device of an axis.
// It always takes the MPI path (MPI_Bcast), within a node and across nodes (dist/ccl/ccl.hpp).
#pragma once

#include "dist/ccl/options.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Collective over the devices of `opt.axis` (same CCLs, same order on all).
/// Returns the root's x (shape and dtype included) on every device; x is
/// ignored on the other devices (their shape and dtype come from the root through the
/// metadata MPI_Allgather), then MPI_Bcast. Throws meshtest::Error, the same on every device
/// of the group (never a hang), for a bad axis (locally), opt.root out of [0, p), devices
/// disagreeing on the root, or a root tensor beyond INT_MAX elements (MPI's counts).
Tensor broadcast(const MeshDevice& mesh, const Tensor& x, const BroadcastOptions& opt = {});

namespace broadcast_bw {
/// nccl-tests bus bandwidth factor: busbw = algbw * 1, with algbw = S / t and S the bytes
/// of the root's tensor.
double bus_factor(int n);
}  // namespace broadcast_bw

}  // namespace meshtest::dist
