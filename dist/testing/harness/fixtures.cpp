// Mesh shapes of a rank count, for the mesh fixtures.
#include "dist/testing/harness/fixtures.hpp"

#include <fmt/format.h>

#include "dist/testing/harness/harness.hpp"
#include "src/core/error.hpp"

namespace meshtest::dist::testing {

std::vector<MeshShape> mesh_shapes(int np) {
  MESHTEST_CHECK(np > 0, "mesh_shapes: {} ranks; need at least 1", np);
  std::vector<MeshShape> shapes;
  for (int rows = 1; rows <= np; ++rows) {
    if (np % rows == 0) {
      shapes.push_back({rows, np / rows});
    }
  }
  return shapes;
}

std::vector<MeshShape> world_mesh_shapes() { return mesh_shapes(world_size()); }

std::string mesh_shape_name(const ::testing::TestParamInfo<MeshShape>& info) {
  return fmt::format("{}x{}", info.param[0], info.param[1]);
}

}  // namespace meshtest::dist::testing
