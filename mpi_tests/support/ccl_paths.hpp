// MPI test helpers for the CCLs' path seam: a registered path by name, and an input whose
// elements are exact and differ across devices.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dist/ccl/path_registry.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "mpi_tests/support/scoped_env.hpp"
#include "src/core/error.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist::ccl_test {

/// The registered path named `name` (a test's stand-in delegates to the MPI path through it).
inline detail::Path& registered_path(std::string_view name) {
  detail::Path* p = detail::find_path(name);
  if (p == nullptr) throw Error("no path named " + std::string(name) + " is registered");
  return *p;
}

/// Whether the shared-memory path applies to the mesh's line of devices: more than one device, all
/// on one node, and the path not turned off (MESHTEST_CCL_SHM=0). Collective over mesh.comm().
inline bool shm_ring_expected(const MeshDevice& mesh) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(mesh.comm(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int on_node = 0;
  MPI_Comm_size(node, &on_node);
  MPI_Comm_free(&node);
  const char* off = std::getenv("MESHTEST_CCL_SHM");
  return mesh.size() > 1 && on_node == mesh.size() &&
         (off == nullptr || std::string_view(off) != "0");
}

/// MESHTEST_CCL_PATH set to `value` for a scope (nullopt: unset), read again by the CCLs at the
/// scope's start and end (the registry reads it once: reread_path_env).
class ScopedPathEnv {
 public:
  explicit ScopedPathEnv(const std::optional<std::string>& value) : env_(detail::kPathEnv, value) {
    detail::reread_path_env();
  }
  // The registry reads the variable lazily, at the next collective: after env_ restored it.
  ~ScopedPathEnv() { detail::reread_path_env(); }
  ScopedPathEnv(const ScopedPathEnv&) = delete;
  ScopedPathEnv& operator=(const ScopedPathEnv&) = delete;

 private:
  test_support::ScopedEnv env_;
};

/// [3, 2p + 1] f32, element k = 1000 * (device + 1) + k (exact), so that a sum over the devices
/// is exact in any order; dim 1 splits unevenly over p > 1 devices.
inline Tensor path_input(const MeshDevice& mesh) {
  const std::int64_t cols = 2 * mesh.size() + 1;
  std::vector<float> v(static_cast<std::size_t>(3 * cols));
  std::iota(v.begin(), v.end(), static_cast<float>(1000 * (mesh.device_id() + 1)));
  return Tensor::from_vector(Shape{3, cols}, v);
}

}  // namespace meshtest::dist::ccl_test
