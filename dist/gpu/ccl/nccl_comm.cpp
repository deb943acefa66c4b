// nccl_comm: making, splitting and releasing a mesh's NCCL communicators; the group's stream and
// staging memory.
#include "dist/gpu/ccl/nccl_comm.hpp"

#include <mpi.h>

#include <cstdlib>
#include <exception>
#include <functional>
#include <string>

#include "dist/gpu/ccl/rank_gpu.hpp"
#include "dist/mesh/agree.hpp"
#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist::gpu {
namespace {

/// Blocking unless MESHTEST_NCCL_BLOCKING=0 (see nccl_calls.hpp); any other value but 1 is an
/// Error naming it.
ncclConfig_t comm_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  const char* v = std::getenv("MESHTEST_NCCL_BLOCKING");
  const std::string_view value = v != nullptr ? v : "1";
  MESHTEST_DIST_CHECK(value == "0" || value == "1",
                      "MESHTEST_NCCL_BLOCKING='{}': expected 1 (blocking communicators, the "
                      "default) or 0 (nonblocking)",
                      value);
  config.blocking = value == "1" ? 1 : 0;
  return config;
}

/// A communicator made by `make` (ncclCommInitRankConfig, or ncclCommSplit of `parent`):
/// tracked as soon as NCCL hands it over, then settled; aborted again when it fails. A
/// nonblocking split runs as an operation of the parent and stores the new communicator only
/// when it completes, so the parent is settled first; `comm` outlives that (NCCL writes it).
ncclComm_t make_comm(const char* what, ncclComm_t parent,
                     const std::function<ncclResult_t(ncclComm_t*)>& make) {
  ncclComm_t comm = nullptr;
  {
    NcclLock lock(what);
    const ncclResult_t rc = make(&comm);
    const bool made = (rc == ncclSuccess || rc == ncclInProgress) && comm != nullptr;
    if (made) track(comm);
    nccl_check(rc, made ? comm : parent, what, __FILE__, __LINE__);
  }
  try {
    if (comm == nullptr && parent != nullptr) {
      settle(parent, what);  // the split's own completion
      NcclLock lock(what);
      MESHTEST_DIST_CHECK(comm != nullptr, "{} finished without a communicator", what);
      track(comm);
    }
    MESHTEST_DIST_CHECK(comm != nullptr, "{} returned no communicator", what);
    settle(comm, what);
  } catch (...) {
    if (comm != nullptr) release(comm, false);
    throw;
  }
  return comm;
}

/// The GPU of this rank, bound now when it was not (see MeshNccl::of).
int ensure_bound(const MeshDevice& mesh) {
  if (bound_gpu() >= 0) return bound_gpu();
  int world = 0;
  MESHTEST_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  MESHTEST_DIST_CHECK(mesh.size() == world,
                      "the NCCL communicators of mesh {} need this rank bound to its GPU, and "
                      "binding is collective over all {} ranks of MPI_COMM_WORLD while the mesh "
                      "has {}: call dist::gpu::bind_rank_to_gpu() on every rank first",
                      mesh.str(), world, mesh.size());
  return bind_rank_to_gpu();
}

int delete_mesh_nccl(MPI_Comm, int, void* attr, void*) {
  delete static_cast<MeshNccl*>(attr);
  return MPI_SUCCESS;
}

/// The attribute key of a mesh communicator's MeshNccl.
int mesh_key() {
  static const int key = delete_only_keyval(&delete_mesh_nccl);
  return key;
}

}  // namespace

NcclGroup::NcclGroup(ncclComm_t comm, int size, int index) try
    : comm_(comm), size_(size), index_(index) {
} catch (...) {
  release(comm, false);  // no stream: the communicator is not kept
}

NcclGroup::~NcclGroup() {
  for (std::byte* w : workspace_) {
    if (w != nullptr) (void)cudaFreeAsync(w, stream_.get());
  }
  for (std::byte* w : retired_) (void)cudaFreeAsync(w, stream_.get());
  release(comm_, !broken_ && std::uncaught_exceptions() == 0);
}

void NcclGroup::synchronize(std::string_view what) {
  if (meshtest::gpu::capturing_stream() != nullptr) return;
  try {
    wait_stream(stream_.get(), comm_, what);
  } catch (...) {
    broken_ = true;
    throw;
  }
}

std::byte* NcclGroup::workspace(std::size_t bytes, int slot) {
  MESHTEST_DIST_CHECK(slot >= 0 && slot < kWorkspaces, "workspace slot {} out of range [0, {})",
                      slot, kWorkspaces);
  std::byte*& workspace = workspace_[static_cast<std::size_t>(slot)];
  std::size_t& have = workspace_bytes_[static_cast<std::size_t>(slot)];
  const bool capturing = meshtest::gpu::capturing_stream() != nullptr;
  pinned_ = pinned_ || capturing;
  if (bytes <= have) return workspace;
  if (workspace != nullptr) {
    if (pinned_) {
      retired_.push_back(workspace);
    } else {
      MESHTEST_DIST_CUDA(cudaFreeAsync(workspace, stream_.get()));
    }
  }
  workspace = nullptr;
  have = 0;
  void* p = nullptr;
  const cudaError_t err =
      cudaMallocAsync(&p, meshtest::gpu::allocation_bytes(bytes), stream_.get());
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    std::size_t free = 0, total = 0;
    const bool known = cudaMemGetInfo(&free, &total) == cudaSuccess;
    fail("cannot allocate {} bytes of staging memory on GPU {} ({}): {}", bytes, stream_.device(),
         known ? fmt::format("{} of {} bytes free", free, total)
               : std::string("free memory unknown"),
         cudaGetErrorString(err));
  }
  workspace = static_cast<std::byte*>(p);
  have = bytes;
  // Made on the group's own stream, which a capture does not record: complete it now, since
  // the recorded work runs on the capture's stream.
  if (capturing) MESHTEST_DIST_CUDA(cudaStreamSynchronize(stream_.get()));
  return workspace;
}

MeshNccl& MeshNccl::of(const MeshDevice& mesh) {
  void* attr = nullptr;
  int found = 0;
  MESHTEST_MPI(MPI_Comm_get_attr(mesh.comm(), mesh_key(), &attr, &found));
  if (found != 0) return *static_cast<MeshNccl*>(attr);
  auto made = std::unique_ptr<MeshNccl>(new MeshNccl(mesh));
  MESHTEST_MPI(MPI_Comm_set_attr(mesh.comm(), mesh_key(), made.get()));
  return *made.release();  // the mesh's communicator owns it from now on
}

MeshNccl::MeshNccl(const MeshDevice& mesh)
    : shape_(mesh.shape()), id_(mesh.device_id()), device_(ensure_bound(mesh)) {
  ncclUniqueId unique{};
  std::string problem;
  if (id_ == 0) {
    try {
      NcclLock lock("ncclGetUniqueId");
      MESHTEST_NCCL(ncclGetUniqueId(&unique), nullptr);
    } catch (const Error& e) {
      problem = e.what();
    }
  }
  agree_or_throw(mesh.comm(), problem);  // rank 0 without an id: every device throws
  MESHTEST_MPI(MPI_Bcast(&unique, sizeof unique, MPI_BYTE, 0, mesh.comm()));
  ncclConfig_t config = comm_config();
  const int n = mesh.size();
  const ncclComm_t comm = make_comm("ncclCommInitRankConfig", nullptr, [&](ncclComm_t* out) {
    return ncclCommInitRankConfig(out, n, unique, id_, &config);
  });
  all_ = std::make_unique<NcclGroup>(comm, n, id_);
}

NcclGroup& MeshNccl::group(int axis) {
  if (axis == kAllAxes) return *all_;
  MESHTEST_DIST_CHECK(axis == 0 || axis == 1,
                      "mesh axis {} out of range: a mesh has axes 0 and 1 (or kAllAxes = -1)",
                      axis);
  auto& g = axis_[static_cast<std::size_t>(axis)];
  if (g) return *g;
  MESHTEST_DIST_CHECK(!all_->broken(),
                      "cannot split axis {} from the mesh's NCCL communicator: an earlier error "
                      "broke it",
                      axis);
  const int r = id_ / shape_[1], c = id_ % shape_[1];
  // Axis 0: the devices of one column, ordered by r; axis 1: one row, ordered by c.
  const int color = axis == 0 ? c : r, key = axis == 0 ? r : c;
  ncclConfig_t config = comm_config();
  const ncclComm_t comm = make_comm("ncclCommSplit", all_->comm(), [&](ncclComm_t* out) {
    return ncclCommSplit(all_->comm(), color, key, out, &config);
  });
  g = std::make_unique<NcclGroup>(comm, shape_[static_cast<std::size_t>(axis)], key);
  return *g;
}

}  // namespace meshtest::dist::gpu
