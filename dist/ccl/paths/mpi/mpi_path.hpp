// mpi_path: the MPI path, which takes every exchange: point-to-point messages and MPI
// collectives on packed, contiguous buffers of MPI's basic types (never a derived datatype of
// interleaved pieces), within a node over Open MPI's shared-memory transport and between nodes
// over the network. MPI counts are ints: a buffer of more than INT_MAX elements is an Error.
#pragma once

#include "dist/ccl/path.hpp"

namespace meshtest::dist::detail {

/// The path (its per-plan state lives in the plans; its messages on the group's communicator
/// or its private duplicate, private_comm.hpp).
Path& mpi_path();

}  // namespace meshtest::dist::detail
