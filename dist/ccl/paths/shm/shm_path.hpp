// shm_path: the shared-memory path, the collectives of a one-node group through its ShmGroup
// (shm.hpp): all_gather and reduce_scatter of equal pieces, all_reduce, all_to_all of equal
// blocks (unless MPI's single-copy transport moves them faster); it declines the rest.
#pragma once

#include "dist/ccl/path.hpp"

namespace meshtest::dist::detail {

/// The path (stateless: each call finds its group through Call::shm()).
Path& shm_path();

}  // namespace meshtest::dist::detail
