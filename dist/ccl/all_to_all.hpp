// all_to_all and all_to_all_v: personalized exchange between the devices of an axis.
// Its path (shared memory when the group is on one node, else MPI, also across nodes) is
// chosen per communicator as dist/ccl/ccl.hpp says.
#pragma once

#include <cstdint>
#include <span>

#include "dist/ccl/options.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Collective over the devices of `opt.axis` (same CCLs, same order on all).
/// x is cut along opt.split_dim into p pieces by the array_split rule; piece j
/// goes to the device with axis index j; the p received pieces are
/// concatenated along opt.concat_dim in axis order. All dims but split_dim
/// must agree across devices, and so must the dtype; when split_dim != concat_dim the
/// split_dim sizes must agree too (the received pieces are concatenated along concat_dim).
/// Agrees on the call (detail::Call), then, for even blocks on one node, the shared-memory
/// ring (detail::ShmGroup; strided blocks are packed into and unpacked out of the slots; from
/// 8 devices, contiguous blocks of 16 KiB or more go to MPI_Alltoall, whose single copy is
/// faster), else MPI_Alltoall (even blocks) or MPI_Alltoallv on contiguous buffers (strided
/// blocks are packed and unpacked: no derived datatypes, whose handling by Open MPI's
/// modified Bruck algorithm corrupted data at 16 devices). Throws meshtest::Error, the same on
/// every device of the group (never a hang), for: a bad axis (locally), split_dim or
/// concat_dim; devices disagreeing on the dims, the dtype or the shape; on the MPI path,
/// buffers beyond INT_MAX elements.
Tensor all_to_all(const MeshDevice& mesh, const Tensor& x, const AllToAllOptions& opt = {});

/// As all_to_all, with explicit per-destination counts: the first
/// send_counts[0] entries along split_dim go to axis index 0, the next
/// send_counts[1] to index 1, and so on. sum(send_counts) must equal
/// x.shape()[split_dim]; send_counts.size() must equal the axis size; counts are >= 0 (zero
/// is fine). x may differ across devices along split_dim. When split_dim != concat_dim, the
/// counts each device receives must agree (pieces concatenated along concat_dim). Every
/// device learns the whole p x p count matrix (an MPI_Allgather of the counts), so a bad count
/// anywhere throws the same meshtest::Error everywhere, naming the device.
Tensor all_to_all_v(const MeshDevice& mesh, const Tensor& x,
                    std::span<const std::int64_t> send_counts, const AllToAllOptions& opt = {});

namespace all_to_all_bw {
/// nccl-tests bus bandwidth factor over n devices (all_to_all and all_to_all_v):
/// busbw = algbw * (n-1)/n, with algbw = S / t and S the bytes of the send buffer.
double bus_factor(int n);
}  // namespace all_to_all_bw

}  // namespace meshtest::dist
