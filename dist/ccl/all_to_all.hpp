// all_to_all and all_to_all_v: personalized exchange between the devices of an axis.
#pragma once

#include <cstdint>
#include <span>

#include "dist/ccl/options.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Collective over the devices of `opt.axis` (same CCLs, same order on all).
/// x is cut along opt.split_dim into p pieces by the array_split rule; piece j
/// goes to the device with axis index j; the p received pieces are
/// concatenated along opt.concat_dim in axis order. All dims but split_dim
/// must agree across devices, and so must the dtype.
Tensor all_to_all(const MeshDevice& mesh, const Tensor& x, const AllToAllOptions& opt = {});

/// As all_to_all, with explicit per-destination counts: the first
/// send_counts[0] entries along split_dim go to axis index 0, the next
/// send_counts[1] to index 1, and so on. sum(send_counts) must equal
/// x.shape()[split_dim]; send_counts.size() must equal the axis size.
Tensor all_to_all_v(const MeshDevice& mesh, const Tensor& x,
                    std::span<const std::int64_t> send_counts, const AllToAllOptions& opt = {});

}  // namespace meshtest::dist
