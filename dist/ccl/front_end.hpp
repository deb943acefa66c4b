// front_end: the collectives on operands in any memory (CclArg): the front ends that the host
// API (all_gather.hpp, ...) calls with host tensors, and a device API with tensors on a GPU.
// Each does what every path shares (checks, agreement, profiler scope, flight record, the plan
// of the call's geometry) and moves the data through the first path that takes it
// (exchange.hpp). The contracts are the host API's, whose headers state them.
#pragma once

#include <cstdint>
#include <span>

#include "dist/ccl/ccl_arg.hpp"
#include "dist/ccl/options.hpp"
#include "dist/mesh/mesh_device.hpp"

namespace meshtest::dist::detail {

/// all_gather of x; the output comes from `out` (x's memory).
void all_gather(const MeshDevice& mesh, const CclArg& x, const AllGatherOptions& opt,
                const MakeOutput& out);
/// reduce_scatter of x; the output comes from `out`.
void reduce_scatter(const MeshDevice& mesh, const CclArg& x, const ReduceScatterOptions& opt,
                    const MakeOutput& out);
/// all_reduce of x into out (x's shape and dtype, in x's memory; out may be x: `in_place`
/// names the call all_reduce_inplace).
void all_reduce(const MeshDevice& mesh, const CclArg& x, const CclArg& out,
                const AllReduceOptions& opt, bool in_place);
/// all_to_all of x; the output comes from `out`.
void all_to_all(const MeshDevice& mesh, const CclArg& x, const AllToAllOptions& opt,
                const MakeOutput& out);
/// all_to_all_v of x (send_counts: host memory); the output comes from `out`.
void all_to_all_v(const MeshDevice& mesh, const CclArg& x,
                  std::span<const std::int64_t> send_counts, const AllToAllOptions& opt,
                  const MakeOutput& out);
/// broadcast of the root's x; the output (the root's shape and dtype) comes from `out`.
void broadcast(const MeshDevice& mesh, const CclArg& x, const BroadcastOptions& opt,
               const MakeOutput& out);

}  // namespace meshtest::dist::detail
