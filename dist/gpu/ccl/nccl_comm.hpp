// nccl_comm: the NCCL communicators of a mesh on GPU ranks — one over the whole mesh (rank 0's
// unique id over MPI) and one per axis split from it — each with the stream its exchanges run on.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "dist/gpu/ccl/nccl_calls.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "src/gpu/capture.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::dist::gpu {

/// One NCCL communicator of a mesh: the p devices of a group (the whole mesh or one
/// axis group), this device's NCCL rank equal to its index in the group; the stream every
/// exchange on it is queued on; its staging memory. Made by MeshNccl, which owns it.
class NcclGroup {
 public:
  /// Takes over `comm` (tracked and settled; nccl_calls.hpp): `size` devices, this one `index`.
  /// The stream is made on the current device.
  NcclGroup(ncclComm_t comm, int size, int index);
  /// Releases the communicator: finalized when it is sound, aborted when it is broken or the
  /// destructor runs while an exception unwinds (its peers may be stuck inside an exchange).
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const { return size_; }
  int index() const { return index_; }
  ncclComm_t comm() const { return comm_; }
  /// (The capture's stream while this thread captures a gpu::Graph: src/gpu/graph.hpp.)
  cudaStream_t stream() const { return meshtest::gpu::stream_for(stream_.get()); }

  /// Queues the NCCL calls that `calls` makes on comm() (between ncclGroupStart and
  /// ncclGroupEnd, under the NCCL lock), then waits until NCCL has queued them on stream()
  /// (settle: they may still run). `what` names them in errors; an error marks the group broken.
  template <class Calls>
  void grouped(std::string_view what, Calls&& calls);

  /// Waits (polling: wait_stream) until the work queued on stream() has finished. Throws
  /// meshtest::Error naming `what` on a CUDA fault, an NCCL error or an abort, and marks the
  /// group broken. Nothing while this thread captures a gpu::Graph (its one stream keeps the
  /// order of the recorded work).
  void synchronize(std::string_view what = "the exchanges queued on the group's stream");

  /// Workspaces of a group: slot 0 is the exchanges' staging memory (exchange.hpp); the others
  /// are free for their callers (e.g. blocks packed before an exchange or unpacked after it).
  static constexpr int kWorkspaces = 3;
  /// At least `bytes` of device memory in workspace `slot` (0 .. kWorkspaces - 1),
  /// stream-ordered on stream() (cudaMallocAsync): valid for work queued on stream() from now
  /// until the next call for that slot. Grows, never shrinks. Throws meshtest::Error naming the
  /// bytes, the GPU and its free memory when the allocation fails. Once a gpu::Graph capture has
  /// used the group's workspaces they are pinned: a buffer replaced by a larger one is kept
  /// until the group is released (a replay may still use it), and a buffer made during a
  /// capture is complete before the capture goes on.
  std::byte* workspace(std::size_t bytes, int slot = 0);

  /// True after an NCCL or CUDA error on this group: it is aborted, not finalized, at the end.
  bool broken() const { return broken_; }

 private:
  ncclComm_t comm_ = nullptr;
  int size_ = 1;
  int index_ = 0;
  meshtest::gpu::Stream stream_;
  std::array<std::byte*, kWorkspaces> workspace_{};
  std::array<std::size_t, kWorkspaces> workspace_bytes_{};
  std::vector<std::byte*> retired_;  // replaced workspaces a graph may use; freed at the end
  bool pinned_ = false;              // a capture has used the workspaces
  bool broken_ = false;
};

/// The NCCL communicators of one MeshDevice, kept as an attribute of the mesh's communicator:
/// made once, released when the mesh frees its communicators (every device together, inside
/// MPI_Comm_free), or at MPI_Finalize for a mesh still alive then.
class MeshNccl {
 public:
  /// The communicators of `mesh`. The first call for a mesh is collective over the mesh: it
  /// binds this rank to its GPU when bind_rank_to_gpu has not run yet (collective over
  /// MPI_COMM_WORLD, so the mesh must then span every rank: otherwise an Error asks for
  /// bind_rank_to_gpu first), then rank 0 of the mesh takes an NCCL unique id, MPI_Bcast gives
  /// it to every device, and ncclCommInitRankConfig makes the whole mesh's communicator (NCCL
  /// rank = device id). Later calls look it up.
  static MeshNccl& of(const MeshDevice& mesh);
  ~MeshNccl() = default;
  MeshNccl(const MeshNccl&) = delete;
  MeshNccl& operator=(const MeshNccl&) = delete;

  /// kAllAxes: the whole mesh's group; 0 or 1: this device's group along the axis (the
  /// devices of one column for axis 0, of one row for axis 1). An axis group's communicator is
  /// split from the whole mesh's at the first call for that axis (ncclCommSplit, color = the
  /// group, key = the axis index): ncclCommSplit is collective over the whole mesh, so that
  /// first call must come from every device of the mesh at the same point, as it does when
  /// every group of the axis runs the axis's first collective. Throws meshtest::Error for
  /// another axis.
  NcclGroup& group(int axis);
  /// The CUDA ordinal of this rank's GPU.
  int device() const { return device_; }

 private:
  explicit MeshNccl(const MeshDevice& mesh);

  std::array<int, 2> shape_{1, 1};
  int id_ = 0;
  int device_ = -1;
  std::unique_ptr<NcclGroup> all_;                  // released last
  std::array<std::unique_ptr<NcclGroup>, 2> axis_;  // released first (axis 1, then 0)
};

template <class Calls>
void NcclGroup::grouped(std::string_view what, Calls&& calls) {
  try {
    {
      NcclLock lock(what);
      MESHTEST_NCCL(ncclGroupStart(), comm_);
      try {
        calls();
      } catch (...) {
        (void)ncclGroupEnd();  // leave no group open on this thread
        throw;
      }
      MESHTEST_NCCL(ncclGroupEnd(), comm_);
    }
    settle(comm_, what);
  } catch (...) {
    broken_ = true;
    throw;
  }
}

}  // namespace meshtest::dist::gpu
