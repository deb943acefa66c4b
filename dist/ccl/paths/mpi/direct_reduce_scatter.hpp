// direct_reduce_scatter: the MPI path's reduce-scatter: every device's block straight to its
// owner in one step of point-to-point messages, reduced there in axis order.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "dist/ccl/options.hpp"
#include "src/core/dtype.hpp"

namespace meshtest::dist::detail {

/// The MPI path's reduce-scatter of blocks laid end to end: block j (counts[j] elements, at
/// byte offset offsets[j]) of every device goes straight to device j (MPI_Isend/MPI_Irecv on
/// `comm`, one step, (p-1)/p of the input sent and received per device, the bandwidth
/// minimum), which then reduces the p blocks with reduce(), in axis order. Owns its
/// workspaces, so a cached plan reuses them.
class DirectReduceScatter {
 public:
  DirectReduceScatter() = default;
  /// `counts`: every device's block, in elements of t; this device is `index` of p.
  DirectReduceScatter(std::vector<int> counts, DType t, int index);
  /// Reduces this device's block of every device's `blocks` into out (out may alias this
  /// device's own block of `blocks`). Collective over comm (p devices, this one `index`).
  void run(const std::byte* blocks, std::byte* out, MPI_Datatype mpi_t, ReduceOp op, MPI_Comm comm);
  const std::vector<int>& counts() const { return counts_; }

 private:
  std::vector<int> counts_;
  std::vector<std::size_t> offsets_;  // bytes
  DType t_ = DType::f32;
  int index_ = 0;
  std::size_t received_bytes_ = 0;
  std::vector<std::byte> received_;  // this device's block from each device (own slot unused)
  std::vector<MPI_Request> requests_;
  std::vector<const std::byte*> terms_;
};

}  // namespace meshtest::dist::detail
