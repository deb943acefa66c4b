// MeshDevice: shapes, row-major ids, axis groups, and bad mesh shapes.
#include <gtest/gtest.h>

#include "dist/mesh/mesh_device.hpp"
#include "src/core/error.hpp"

namespace meshtest::dist {
namespace {

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

TEST(MeshDevice, LineIsOneByN) {
  const MeshDevice mesh = MeshDevice::line();
  EXPECT_EQ(mesh.rows(), 1);
  EXPECT_EQ(mesh.cols(), world_size());
  EXPECT_EQ(mesh.axis_size(1), world_size());
  EXPECT_EQ(mesh.axis_size(0), 1);
}

TEST(MeshDevice, RowMajorIdsAndAxisGroups) {
  const int n = world_size();
  for (int rows = 1; rows <= n; ++rows) {
    if (n % rows != 0) continue;
    const int cols = n / rows;
    const MeshDevice mesh({rows, cols});
    const auto [r, c] = mesh.coord();
    EXPECT_EQ(mesh.device_id(), r * cols + c);
    EXPECT_EQ(mesh.device_at(r, c), mesh.device_id());
    // Axis 0 groups a column (size rows, index r); axis 1 a row (size cols, index c).
    EXPECT_EQ(mesh.axis_size(0), rows);
    EXPECT_EQ(mesh.axis_index(0), r);
    EXPECT_EQ(mesh.axis_size(1), cols);
    EXPECT_EQ(mesh.axis_index(1), c);
    int rank_in_col = -1, rank_in_row = -1;
    MPI_Comm_rank(mesh.comm(0), &rank_in_col);
    MPI_Comm_rank(mesh.comm(1), &rank_in_row);
    EXPECT_EQ(rank_in_col, r);
    EXPECT_EQ(rank_in_row, c);
    // The sum of device ids in my row is r*cols*cols + cols*(cols-1)/2.
    int id = mesh.device_id(), row_sum = 0;
    MPI_Allreduce(&id, &row_sum, 1, MPI_INT, MPI_SUM, mesh.comm(1));
    EXPECT_EQ(row_sum, r * cols * cols + cols * (cols - 1) / 2);
  }
}

TEST(MeshDevice, BadShapesThrow) {
  const int n = world_size();
  EXPECT_THROW(MeshDevice({n + 1}), Error);
  EXPECT_THROW(MeshDevice({2, n}), Error);
  EXPECT_THROW(MeshDevice({0, n}), Error);
  EXPECT_THROW(MeshDevice({-1, -n}), Error);
  EXPECT_THROW(MeshDevice({1, 1, n}), Error);
  const MeshDevice mesh({1, n});
  EXPECT_THROW(mesh.comm(2), Error);
  EXPECT_THROW(mesh.axis_size(-2), Error);
  try {
    MeshDevice({n + 1});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("communicator has"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshtest::dist
