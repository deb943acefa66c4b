// Every collective of meshtest, in one include.
//
// Each collective is a thin front end (dist/ccl/<collective>.cpp: checks, agreement, profiler
// scope, flight record, the plan of the call's geometry) over paths, each a folder of
// dist/ccl/paths implementing the interface of dist/ccl/path.hpp and registering itself
// (dist/ccl/path_registry.hpp); a call tries the registered paths of its operand's memory by
// priority, and the first that takes the exchange moves the data (a test or bench may name one:
// the option `path`, MESHTEST_CCL_PATH). On host memory,
// per communicator (a mesh axis, or the whole mesh for kAllAxes), decided at its first agreed
// call and agreed across the group:
//   - shared memory (paths/shm: detail::ShmGroup, one MPI-3 shared window) when it has more
//     than one device, all of them on one node (MPI_COMM_TYPE_SHARED: Open MPI's node, one
//     host) and none has MESHTEST_CCL_SHM=0; it takes all_reduce, and all_gather,
//     reduce_scatter and all_to_all of equal pieces (all_to_all: unless MPI's single-copy
//     transport moves the blocks faster), and leaves the rest to MPI;
//   - otherwise MPI (paths/mpi): point-to-point messages and MPI collectives on packed,
//     contiguous buffers (no derived datatypes), which Open MPI carries over its shared-memory
//     transport within a node and over the network (TCP, ...) between nodes;
//   - all_reduce over devices on several nodes, each node holding the same number q of
//     consecutive axis indices (`mpirun --map-by slot`), takes the node chain
//     (paths/node_chain: shared memory within each node, MPI between nodes, chained in axis
//     order) when q >= 4, or whenever MESHTEST_CCL_NODE_CHAIN=1; MESHTEST_CCL_NODE_CHAIN=0
//     keeps it on MPI.
// So on a 2-D mesh whose rows lie within nodes and whose columns cross them, the row axis
// takes shared memory and the column axis MPI, each on its own. Every path keeps every
// contract of these headers bit for bit (same reduction order, same errors, never a hang);
// only the speed differs. Tensors on a GPU take the device path the GPU side installs.
// `meshtest-bench ccl` prints where its ranks run and the path taken; docs/multi-node.md says
// how to run across hosts.
#pragma once

#include "dist/ccl/all_gather.hpp"
#include "dist/ccl/all_reduce.hpp"
#include "dist/ccl/all_to_all.hpp"
#include "dist/ccl/broadcast.hpp"
#include "dist/ccl/reduce_scatter.hpp"
