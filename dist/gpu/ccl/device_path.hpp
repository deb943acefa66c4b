// device_path: the CCLs' path for operands in GPU memory (dist/ccl/path.hpp) — each exchange on
// the NCCL group of the call's axis (exchange.hpp), blocks along a dim that is not leading packed
// and unpacked on the GPU, and a polling wait for the result inside the call.
#pragma once

#include "dist/ccl/path.hpp"

namespace meshtest::dist::gpu {

/// The device path. Each exchange, collective over the call's group like the call itself:
///  - runs on MeshNccl::of(mesh).group(axis) (nccl_comm.hpp): the first call on a mesh makes the
///    mesh's NCCL communicator and the first on an axis splits the axis's, each collective over
///    every device of the mesh;
///  - reduces with the agreed numerics (exact: the CPU path's bits; nccl: NCCL's own);
///  - packs blocks along a dim that is not leading into the group's workspaces on the GPU
///    (a 2-D copy per block on the group's stream) and unpacks received blocks the same way;
///  - waits, polling, until the group's stream has finished the exchange (NcclGroup::synchronize:
///    a peer's failure or an abort ends the wait with an Error), so the output is complete when
///    the collective returns and a stuck device is seen inside its collective.
/// Takes every exchange it is given (operands in the memory of this rank's GPU).
detail::Path& device_path();

/// Registers device_path() as the CCLs' path "nccl" for GPU memory (detail::register_path) the
/// first time it is called; later calls do nothing. The collectives on DeviceTensors (ccl.hpp)
/// call it.
void install_device_path();

}  // namespace meshtest::dist::gpu
