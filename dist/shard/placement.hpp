// Placements (Replicate, Shard(dim), Partial(op)) per mesh axis, and redistribution on the CCLs.
#pragma once

#include <fmt/format.h>

#include <array>
#include <string>
#include <variant>

#include "dist/ccl/options.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Every device of the axis holds the whole tensor.
struct Replicate {
  bool operator==(const Replicate&) const = default;
};

/// Device i of the axis holds slice i along `dim` (array_split rule: the first n % p devices get
/// ceil(n/p), the rest floor(n/p); a slice may be empty). Negative dims count from the end.
struct Shard {
  int dim = 0;
  bool operator==(const Shard&) const = default;
};

/// The devices of the axis hold tensors of the full shape whose `op`-reduction over the axis is
/// the tensor. Canonical form made by distribute(): for sum, the device with axis index 0 holds
/// the tensor and the others hold zeros (-0.0 for floating dtypes, the exact additive identity,
/// so the sum gives back every bit, signed zeros included); for max, min and avg every device
/// holds the tensor (avg is exact when n times each value is exact, e.g. small integers).
struct Partial {
  ReduceOp op = ReduceOp::sum;
  bool operator==(const Partial&) const = default;
};

/// How a tensor lives on one mesh axis.
using Placement = std::variant<Replicate, Shard, Partial>;

/// One placement per mesh axis: [0] for axis 0 (the devices of a column), [1] for axis 1 (the
/// devices of a row). A 1-D (1 x N) mesh uses axis 1 and leaves axis 0 Replicate.
///
/// Both axes may shard the same tensor dim: axis 0 is the outer split and axis 1 splits each
/// axis-0 slice again (nested array_split), so device (r, c) holds piece c of piece r and the
/// pieces in row-major device order concatenate to the tensor. The sizes are those of an
/// array_split over rows * cols devices when rows * cols divides the dim.
///
/// Partial on both axes must use the same op (a max of sums is not a sum of maxes).
using Placements = std::array<Placement, 2>;

/// Both axes Replicate.
inline const Placements kReplicated{Replicate{}, Replicate{}};

/// The placements of a 1-D (1 x N) mesh: axis 0 Replicate, axis 1 `p`.
inline Placements placements_1d(Placement p) { return {Replicate{}, p}; }

/// "Replicate", "Shard(1)", "Partial(sum)".
std::string str(const Placement& p);
/// "[Shard(0), Replicate]".
std::string str(const Placements& p);

/// Checks `p` against a tensor of `shape` and `dtype` and returns it with Shard dims in
/// [0, rank). Throws meshtest::Error (with the rank) for a Shard dim out of range, Partial on
/// both axes with different ops, Partial of u8 (cannot be reduced) and Partial(avg) of an
/// integer dtype. Local: no communication.
Placements validate_placements(const Placements& p, const Shape& shape, DType dtype);

/// Shape of this device's shard of a tensor of shape `global` placed by `p`. Local.
Shape local_shape(const Shape& global, const MeshDevice& mesh, const Placements& p);

/// Places `x`, which is replicated over mesh `axis` (0 or 1), as `p` on that axis: Shard slices
/// by this device's axis index, Partial(sum) keeps x at axis index 0 and zeros elsewhere, other
/// placements keep x. Local: no communication.
Tensor distribute_axis(const Tensor& x, const MeshDevice& mesh, int axis, const Placement& p);

/// full: the whole tensor, the same on every device. Returns this device's local shard under
/// `p` (axis 0 applied first, then axis 1; shape local_shape(full.shape(), mesh, p)).
/// Local: no communication.
Tensor distribute(const Tensor& full, const MeshDevice& mesh, const Placements& p);

/// Collective over the whole mesh (every device calls it with the same placements, rank and
/// dtype). local: this device's shard under `p`. Returns the full tensor on every device:
/// all_gather per Shard axis, all_reduce per Partial axis. Equals redistribute(local, mesh, p,
/// kReplicated).
Tensor gather_full(const Tensor& local, const MeshDevice& mesh, const Placements& p);

/// Collective over the whole mesh (every device calls it with the same placements, rank and
/// dtype). local: this device's shard under `from`; returns its shard under `to`, equal bit for
/// bit to distribute(full, mesh, to) when local = distribute(full, mesh, from) (for sum, max
/// and min; avg as exact as n times the values). Per axis:
///   Shard(d)   -> Replicate  all_gather(dim d)
///   Partial    -> Replicate  all_reduce(op)
///   Partial    -> Shard(d)   reduce_scatter(dim d, op)
///   Shard(i)   -> Shard(j)   all_to_all(split j, concat i)
///   Replicate  -> Shard(d)   local slice
///   Replicate  -> Partial    local (zeros off axis index 0 for sum)
///   Shard(d)   -> Partial    all_gather, then local
///   Partial(a) -> Partial(b) all_reduce(a), then local
/// Axis 0 changes first, then axis 1. When axis 1 shards a dim that axis 0 shards before or
/// after the change (nesting), axis 1 is first gathered to Replicate and re-placed at the end.
/// Throws meshtest::Error on every device, before any communication, for invalid placements.
Tensor redistribute(const Tensor& local, const MeshDevice& mesh, const Placements& from,
                    const Placements& to);

}  // namespace meshtest::dist

namespace meshtest::dist::detail {
/// fmt support for Replicate, Shard, Partial, Placement and Placements through str().
struct placement_formatter : fmt::formatter<std::string> {
  template <class P>
  auto format(const P& p, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(meshtest::dist::str(p), ctx);
  }
};
}  // namespace meshtest::dist::detail

template <>
struct fmt::formatter<meshtest::dist::Replicate> : meshtest::dist::detail::placement_formatter {};
template <>
struct fmt::formatter<meshtest::dist::Shard> : meshtest::dist::detail::placement_formatter {};
template <>
struct fmt::formatter<meshtest::dist::Partial> : meshtest::dist::detail::placement_formatter {};
template <>
struct fmt::formatter<meshtest::dist::Placement> : meshtest::dist::detail::placement_formatter {};
template <>
struct fmt::formatter<meshtest::dist::Placements> : meshtest::dist::detail::placement_formatter {};
