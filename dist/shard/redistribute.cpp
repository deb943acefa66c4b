// redistribute and gather_full: placement changes mapped onto the CCLs, one mesh axis at a time.
#include <cstdint>
#include <variant>
#include <vector>

#include "dist/ccl/ccl.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "dist/shard/placement.hpp"

namespace meshtest::dist {

namespace {

/// The tensor dim `p` shards, or -1.
int shard_dim(const Placement& p) {
  const auto* s = std::get_if<Shard>(&p);
  return s ? s->dim : -1;
}

/// Shard(from_dim) -> Shard(to_dim) on one axis by all_to_all(split to_dim, concat from_dim).
/// all_to_all needs the same shape on every device, so uneven shards along from_dim are padded
/// to ceil(n/p) first (n summed over the axis) and each received piece trimmed after.
Tensor reshard(const Tensor& x, const MeshDevice& mesh, int axis, int from_dim, int to_dim) {
  const AllToAllOptions opt{.split_dim = to_dim, .concat_dim = from_dim, .axis = axis};
  const int p = mesh.axis_size(axis);
  const Tensor mine = Tensor::from_vector<std::int64_t>({1}, {x.shape()[from_dim]});
  const std::int64_t n = all_reduce(mesh, mine, {.axis = axis}).data<std::int64_t>()[0];
  if (n % p == 0) return all_to_all(mesh, x, opt);
  const std::int64_t ceil = n / p + 1;
  Tensor padded(x.shape().with(from_dim, ceil), x.dtype());
  padded.assign_slice(from_dim, 0, x);
  const Tensor y = all_to_all(mesh, padded, opt);
  std::vector<Tensor> pieces;
  pieces.reserve(static_cast<std::size_t>(p));
  for (int k = 0; k < p; ++k) {
    pieces.push_back(y.slice(from_dim, k * ceil, split_range(n, p, k).size));
  }
  return concat(pieces, from_dim);
}

/// Changes the placement on mesh `axis` alone, from `from` to `to`. Valid when the other axis
/// does not shard a dim that `from` or `to` shards (then the change is a 1-D redistribution
/// within each group of the axis).
Tensor change_axis(const Tensor& x, const MeshDevice& mesh, int axis, const Placement& from,
                   const Placement& to) {
  if (from == to) return x;
  if (std::holds_alternative<Partial>(to)) {
    // Through Replicate: gather or reduce, then the local Partial form.
    const Tensor r = change_axis(x, mesh, axis, from, Replicate{});
    return distribute_axis(r, mesh, axis, to);
  }
  if (std::holds_alternative<Replicate>(from)) return distribute_axis(x, mesh, axis, to);
  const int from_dim = shard_dim(from);
  const int to_dim = shard_dim(to);
  if (const auto* part = std::get_if<Partial>(&from)) {
    if (to_dim < 0) return all_reduce(mesh, x, {.axis = axis, .op = part->op});
    return reduce_scatter(mesh, x, {.dim = to_dim, .axis = axis, .op = part->op});
  }
  // from is Shard(from_dim).
  if (to_dim < 0) return all_gather(mesh, x, {.dim = from_dim, .axis = axis});
  return reshard(x, mesh, axis, from_dim, to_dim);
}

}  // namespace

Tensor redistribute(const Tensor& local, const MeshDevice& mesh, const Placements& from,
                    const Placements& to) {
  const Placements src = validate_placements(from, local.shape(), local.dtype());
  const Placements dst = validate_placements(to, local.shape(), local.dtype());
  // Axis 1 changes within one row, whose devices share their axis-0 placement, so its change
  // is always a 1-D redistribution. Axis 0's change is one only when axis 1 does not shard a
  // dim axis 0 touches (nested same-dim shards): then axis 1 goes to Replicate first.
  Placements cur = src;
  Tensor x = local;
  const int inner = shard_dim(cur[1]);
  if (cur[0] != dst[0] && inner >= 0 &&
      (inner == shard_dim(cur[0]) || inner == shard_dim(dst[0]))) {
    x = change_axis(x, mesh, 1, cur[1], Replicate{});
    cur[1] = Replicate{};
  }
  x = change_axis(x, mesh, 0, cur[0], dst[0]);
  return change_axis(x, mesh, 1, cur[1], dst[1]);
}

Tensor gather_full(const Tensor& local, const MeshDevice& mesh, const Placements& p) {
  return redistribute(local, mesh, p, kReplicated);
}

}  // namespace meshtest::dist
