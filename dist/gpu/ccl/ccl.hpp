// ccl (GPU): all_gather, reduce_scatter, all_reduce, all_to_all(_v) and broadcast on tensors on
// this rank's GPU — the host API's front ends (options, agreement, desync checks, errors, flight
// record, profiler scope) over the device path (device_path.hpp), with the CPU path's bits.
#pragma once

#include <cstdint>
#include <span>

#include "dist/ccl/options.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "src/gpu/device_tensor.hpp"

namespace meshtest::dist {

using DeviceTensor = meshtest::gpu::DeviceTensor;

// Every function here is the host function of the same name (dist/ccl/<collective>.hpp) on
// DeviceTensors: collective over the devices of opt.axis (same CCLs, same order on all), with the
// same options, shapes, uneven splits (array_split), reduction rule and errors, and an Error on
// every device of the group, never a hang, where the host call has one: a bad axis or dim;
// devices disagreeing on the call (another collective or none), on an option, on the dtype or on
// the shape, or passing host memory where the others pass GPU memory — all found before NCCL is
// entered. On GPU ranks:
//  - Binding: the rank is bound to its GPU (dist/gpu/ccl/rank_gpu.hpp: bind_rank_to_gpu, collective
//    over MPI_COMM_WORLD) before its first collective here, and x is on that GPU; otherwise every
//    device of the group throws, naming the rank's problem (not bound; x on cuda:i while the
//    rank's GPU is cuda:j). Each call runs with the rank's GPU current; outputs are allocated
//    there.
//  - Numerics (all_reduce, reduce_scatter): opt.numerics, or MESHTEST_GPU_REDUCE when it is
//    Numerics::from_env (the default): exact (the default; the bits of the host call on the same
//    values: axis order, bf16 and f16 accumulated in f32 and rounded once, avg divided in f32, f64
//    for f64) or nccl (NCCL's own reductions: its order and roundings, which vary with its
//    algorithm and p; equal to exact for integer sums, max and min). Agreed across the group like
//    an option; a MESHTEST_GPU_REDUCE other than exact or nccl is an Error naming it.
//  - Synchronization: x must be complete when the call is made (DeviceTensor's own operations
//    leave it so; work that a stream queued on it must have finished). The call returns once its
//    output is complete, having waited by polling (a peer's failure, an NCCL error or an abort
//    ends the wait with an Error naming the collective). Inside a gpu::Graph capture
//    (src/gpu/graph.hpp) the call records its work on the capture's stream and does not wait.
//  - Communicators: the first collective on a mesh makes its NCCL communicator, and the first on
//    an axis splits the axis's from it, each collective over every device of the mesh: every
//    device of the mesh makes its first collective on each axis (in every group of the axis) at
//    the same point of the program, as SPMD code does.
//  - A perf::Trace captures host tensors only: a call here while one is captured is an Error.

/// all_gather (dist/ccl/all_gather.hpp) of x along opt.dim.
DeviceTensor all_gather(const MeshDevice& mesh, const DeviceTensor& x,
                        const AllGatherOptions& opt = {});

/// reduce_scatter (dist/ccl/reduce_scatter.hpp) of x along opt.dim, with opt.numerics.
DeviceTensor reduce_scatter(const MeshDevice& mesh, const DeviceTensor& x,
                            const ReduceScatterOptions& opt = {});

/// all_reduce (dist/ccl/all_reduce.hpp) of x, with opt.numerics.
DeviceTensor all_reduce(const MeshDevice& mesh, const DeviceTensor& x,
                        const AllReduceOptions& opt = {});

/// In-place all_reduce: x is overwritten with the result. Same contract.
void all_reduce_inplace(const MeshDevice& mesh, DeviceTensor& x, const AllReduceOptions& opt = {});

/// all_to_all (dist/ccl/all_to_all.hpp) of x from opt.split_dim to opt.concat_dim.
DeviceTensor all_to_all(const MeshDevice& mesh, const DeviceTensor& x,
                        const AllToAllOptions& opt = {});

/// all_to_all_v (dist/ccl/all_to_all.hpp): send_counts (host memory, one per device of the
/// group) entries along opt.split_dim to each device.
DeviceTensor all_to_all_v(const MeshDevice& mesh, const DeviceTensor& x,
                          std::span<const std::int64_t> send_counts,
                          const AllToAllOptions& opt = {});

/// broadcast (dist/ccl/broadcast.hpp) of the root's x; every device gets the root's shape and
/// dtype (the other devices' x is not read).
DeviceTensor broadcast(const MeshDevice& mesh, const DeviceTensor& x,
                       const BroadcastOptions& opt = {});

}  // namespace meshtest::dist
