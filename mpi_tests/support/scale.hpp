// MPI test helper for the scale runs (more than 8 ranks: 12, 16 and 32, label scale). What they
// are for is what changes with the rank count: group sizes, sizes that stop dividing, the node
// chain's layouts, Open MPI's algorithm switches. The data types and mesh shapes that a test
// crosses with it are covered in full at 1-8 ranks. Above 8, where a test's work grows as p^2
// (every device makes every device's input for its reference, on 2 cores), a test takes a sample
// of them that moves with p and with the caller's salt, so that the scale runs together still
// meet every item (docs/writing-a-test.md, "Every rank count is a valid run").
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <vector>

#include "dist/testing/harness/fixtures.hpp"

namespace meshtest::test_support {

/// The largest rank count at which tests cross every data type and mesh shape.
inline constexpr int kFullProductUpTo = 8;

/// Every item of `all` at p <= kFullProductUpTo ranks; above, `keep` consecutive ones (wrapping)
/// from index (p + salt) mod |all|.
template <class T>
std::vector<T> sample_at_scale(std::span<const T> all, int p, std::size_t keep = 1,
                               std::size_t salt = 0) {
  if (p <= kFullProductUpTo || all.size() <= keep) return {all.begin(), all.end()};
  std::vector<T> out;
  for (std::size_t i = 0; i < keep; ++i) {
    out.push_back(all[(static_cast<std::size_t>(p) + salt + i) % all.size()]);
  }
  return out;
}

/// The R x C mesh shapes a test runs on of `all` (the shapes of p ranks): all of them at p <=
/// kFullProductUpTo; above, the two lines [1, p] and [p, 1] and the squarest shape with R < C
/// and its transpose (4x8 and 8x4 at 32, 3x4 and 4x3 at 12, 4x4 at 16).
inline std::vector<std::array<int, 2>> mesh_shapes_at_scale(
    const std::vector<std::array<int, 2>>& all) {
  if (all.empty() || all.front()[0] * all.front()[1] <= kFullProductUpTo) return all;
  std::vector<std::array<int, 2>> out;
  const std::array<int, 2>* square = nullptr;  // the largest R with R <= C
  for (const auto& s : all) {
    if (s[0] <= s[1] && s[0] > 1 && (square == nullptr || s[0] > (*square)[0])) square = &s;
  }
  for (const auto& s : all) {
    const bool line = s[0] == 1 || s[1] == 1;
    const bool squarest =
        square != nullptr && (s == *square || (s[0] == (*square)[1] && s[1] == (*square)[0]));
    if (line || squarest) out.push_back(s);
  }
  return out;
}

}  // namespace meshtest::test_support

/// MESHTEST_INSTANTIATE_MESH_SHAPES(suite) on mesh_shapes_at_scale(world_mesh_shapes()).
#define MESHTEST_INSTANTIATE_MESH_SHAPES_AT_SCALE(suite)                                       \
  INSTANTIATE_TEST_SUITE_P(Mesh, suite,                                                        \
                           ::testing::ValuesIn(::meshtest::test_support::mesh_shapes_at_scale( \
                               ::meshtest::dist::testing::world_mesh_shapes())),               \
                           ::meshtest::dist::testing::mesh_shape_name)
