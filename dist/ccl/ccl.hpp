// Every collective of meshtest, in one include.
//
// Which path a collective takes (broadcast: always MPI). Each communicator a CCL runs on (a mesh
// axis, or the whole mesh for kAllAxes) decides once, at its first agreed call
// (detail::ShmGroup::establish):
//   - shared memory (detail::ShmGroup, one MPI-3 shared window) when it has more than one
//     device, all of them on one node (MPI_COMM_TYPE_SHARED: Open MPI's node, one host) and
//     none has MESHTEST_CCL_SHM=0;
//   - otherwise MPI: point-to-point messages and MPI collectives on packed, contiguous buffers
//     (no derived datatypes), which Open MPI carries over its shared-memory transport within
//     a node and over the network (TCP, ...) between nodes.
//   - all_reduce over devices on several nodes, each node holding the same number q of
//     consecutive axis indices (`mpirun --map-by slot`), takes the node chain
//     (detail::NodeChain: shared memory within each node, MPI between nodes, chained in axis
//     order) when q >= 4, or whenever MESHTEST_CCL_NODE_CHAIN=1; MESHTEST_CCL_NODE_CHAIN=0
//     keeps it on MPI.
// So on a 2-D mesh whose rows lie within nodes and whose columns cross them, the row axis
// takes shared memory and the column axis MPI, each on its own. Both paths keep every
// contract of these headers bit for bit (same reduction order, same errors, never a hang);
// only the speed differs. `meshtest-bench ccl` prints where its ranks run and the path taken;
// docs/multi-node.md says how to run across hosts.
#pragma once

#include "dist/ccl/all_gather.hpp"
#include "dist/ccl/all_reduce.hpp"
#include "dist/ccl/all_to_all.hpp"
#include "dist/ccl/broadcast.hpp"
#include "dist/ccl/reduce_scatter.hpp"
