// tp_layout: the TP axis check, a device's place on it, and the placements of the layout.
#include "dist/parallel/tp_layout.hpp"

#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist {

int token_axis(const TpOptions& o) {
  MESHTEST_DIST_CHECK(o.tp_axis == 0 || o.tp_axis == 1,
                      "tensor parallel: tp_axis is {}, expected 0 or 1", o.tp_axis);
  return 1 - o.tp_axis;
}

TpRank tp_rank(const MeshDevice& mesh, const TpOptions& o) {
  token_axis(o);
  return {.size = mesh.axis_size(o.tp_axis), .index = mesh.axis_index(o.tp_axis)};
}

Placements tp_activation_placements(const TpOptions& o) {
  Placements p{Replicate{}, Replicate{}};
  p[static_cast<std::size_t>(token_axis(o))] = Shard{0};
  return p;
}

Placements tp_logits_placements(const TpOptions& o) {
  Placements p = tp_activation_placements(o);
  p[static_cast<std::size_t>(o.tp_axis)] = Shard{1};
  return p;
}

}  // namespace meshtest::dist
