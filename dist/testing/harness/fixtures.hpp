// Mesh fixtures for MPI tests: a 1 x N mesh, and every R x C mesh shape of the world.
// A test written for one fixed mesh shape: FixedMeshTest (dist/testing/fused/chunked.hpp, in
// meshtest::fused_kit), which can fall back to device 0's chunk on one device when started on
// fewer ranks than the mesh needs.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "dist/testing/harness/harness.hpp"

namespace meshtest::dist::testing {

/// A mesh shape {rows, cols}.
using MeshShape = std::array<int, 2>;

/// Every {rows, cols} with rows * cols == np, rows ascending (1 x np first, np x 1 last).
/// Throws meshtest::Error unless np > 0.
std::vector<MeshShape> mesh_shapes(int np);

/// mesh_shapes(size of MPI_COMM_WORLD).
std::vector<MeshShape> world_mesh_shapes();

/// "2x4": the name of a mesh-shape test parameter.
std::string mesh_shape_name(const ::testing::TestParamInfo<MeshShape>& info);

/// Fixture: mesh() is the 1 x N mesh over MPI_COMM_WORLD, built (collectively) in SetUp.
class MeshTest : public ::testing::Test {
 protected:
  void SetUp() override { mesh_.emplace(MeshDevice::line()); }
  void TearDown() override { mesh_.reset(); }
  const MeshDevice& mesh() const { return *mesh_; }

 private:
  std::optional<MeshDevice> mesh_;
};

/// Parameterized fixture: mesh() is the GetParam() = {rows, cols} mesh over MPI_COMM_WORLD.
/// Instantiate a suite derived from it with MESHTEST_INSTANTIATE_MESH_SHAPES(Suite).
class MeshShapeTest : public ::testing::TestWithParam<MeshShape> {
 protected:
  void SetUp() override { mesh_.emplace(std::vector<int>{GetParam()[0], GetParam()[1]}); }
  void TearDown() override { mesh_.reset(); }
  const MeshDevice& mesh() const { return *mesh_; }

 private:
  std::optional<MeshDevice> mesh_;
};

}  // namespace meshtest::dist::testing

/// Runs every test of `suite` (derived from MeshShapeTest) on every R x C mesh of the world,
/// named Mesh/suite.Test/1x4, .../2x2, .../4x1.
#define MESHTEST_INSTANTIATE_MESH_SHAPES(suite)                                                 \
  INSTANTIATE_TEST_SUITE_P(Mesh, suite,                                                         \
                           ::testing::ValuesIn(::meshtest::dist::testing::world_mesh_shapes()), \
                           ::meshtest::dist::testing::mesh_shape_name)
