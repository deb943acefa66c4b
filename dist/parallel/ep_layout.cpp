// ep_layout: the EP axis check and a device's places on the EP and TP axes.
#include "dist/parallel/ep_layout.hpp"

#include "dist/mesh/mpi_check.hpp"
#include "dist/parallel/tp_layout.hpp"

namespace meshtest::dist {

int ep_tp_axis(const EpOptions& o) {
  MESHTEST_DIST_CHECK(o.ep_axis == 0 || o.ep_axis == 1,
                      "expert parallel: ep_axis is {}, expected 0 or 1 (a mesh axis)", o.ep_axis);
  return 1 - o.ep_axis;
}

TpRank ep_rank(const MeshDevice& mesh, const EpOptions& o) {
  ep_tp_axis(o);
  return {.size = mesh.axis_size(o.ep_axis), .index = mesh.axis_index(o.ep_axis)};
}

TpRank ep_tp_rank(const MeshDevice& mesh, const EpOptions& o) {
  return tp_rank(mesh, {.tp_axis = ep_tp_axis(o)});
}

Placements ep_activation_placements(const EpOptions& o) {
  return tp_activation_placements({.tp_axis = ep_tp_axis(o)});
}

}  // namespace meshtest::dist
