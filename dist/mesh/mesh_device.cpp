// MeshDevice: shape checks, row-major ids and axis communicators.
#include "dist/mesh/mesh_device.hpp"

#include <fmt/ranges.h>

#include "dist/mesh/environment.hpp"
#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist {

namespace {
CommKeeper g_keeper = nullptr;
}  // namespace

void set_comm_keeper(CommKeeper keeper) noexcept { g_keeper = keeper; }

MeshDevice::MeshDevice(std::vector<int> shape, MPI_Comm parent) {
  MESHTEST_DIST_CHECK(shape.size() == 1 || shape.size() == 2,
                      "MeshDevice: shape {} has {} dims; a mesh has 1 or 2", fmt::join(shape, "x"),
                      shape.size());
  for (int d : shape) {
    MESHTEST_DIST_CHECK(d > 0, "MeshDevice: shape {} has a non-positive dim {}",
                        fmt::join(shape, "x"), d);
  }
  shape_ =
      shape.size() == 1 ? std::array<int, 2>{1, shape[0]} : std::array<int, 2>{shape[0], shape[1]};
  int n = 0;
  MESHTEST_MPI(MPI_Comm_size(parent, &n));
  MESHTEST_DIST_CHECK(size() == n,
                      "MeshDevice: mesh {} has {} devices but the communicator has {} ranks "
                      "(run with mpirun -np {} or choose a mesh whose product is {})",
                      str(), size(), n, size(), n);
  MESHTEST_MPI(MPI_Comm_dup(parent, &all_));
  MESHTEST_MPI(MPI_Comm_set_errhandler(all_, MPI_ERRORS_RETURN));
  MESHTEST_MPI(MPI_Comm_rank(all_, &id_));
  const auto [r, c] = coord();
  // Axis 0: the devices of one column, ordered by r. Axis 1: one row, ordered by c.
  MESHTEST_MPI(MPI_Comm_split(all_, c, r, &axis_[0]));
  MESHTEST_MPI(MPI_Comm_split(all_, r, c, &axis_[1]));
  for (MPI_Comm a : axis_) MESHTEST_MPI(MPI_Comm_set_errhandler(a, MPI_ERRORS_RETURN));
}

MeshDevice MeshDevice::line(MPI_Comm parent) {
  int n = 0;
  MESHTEST_MPI(MPI_Comm_size(parent, &n));
  return MeshDevice({n}, parent);
}

MeshDevice::~MeshDevice() { release(); }

void MeshDevice::release() noexcept {
  if (!mpi_active()) return;
  for (MPI_Comm* c : {&all_, &axis_[0], &axis_[1]}) {
    if (*c == MPI_COMM_NULL) continue;
    if (g_keeper != nullptr) {
      g_keeper(*c);
    } else {
      MPI_Comm_free(c);
    }
    *c = MPI_COMM_NULL;
  }
}

MeshDevice::MeshDevice(MeshDevice&& o) noexcept
    : shape_(o.shape_), id_(o.id_), all_(o.all_), axis_(o.axis_) {
  o.all_ = MPI_COMM_NULL;
  o.axis_ = {MPI_COMM_NULL, MPI_COMM_NULL};
}

MeshDevice& MeshDevice::operator=(MeshDevice&& o) noexcept {
  if (this != &o) {
    release();
    shape_ = o.shape_;
    id_ = o.id_;
    all_ = o.all_;
    axis_ = o.axis_;
    o.all_ = MPI_COMM_NULL;
    o.axis_ = {MPI_COMM_NULL, MPI_COMM_NULL};
  }
  return *this;
}

int MeshDevice::device_at(int r, int c) const {
  MESHTEST_DIST_CHECK(r >= 0 && r < rows() && c >= 0 && c < cols(),
                      "MeshDevice {}: coordinate ({}, {}) out of range", str(), r, c);
  return r * cols() + c;
}

MPI_Comm MeshDevice::comm(int axis) const {
  MESHTEST_DIST_CHECK(axis == kAllAxes || axis == 0 || axis == 1,
                      "mesh axis {} out of range: a mesh has axes 0 and 1 (or kAllAxes = -1)",
                      axis);
  return axis == kAllAxes ? all_ : axis_[static_cast<std::size_t>(axis)];
}

int MeshDevice::axis_size(int axis) const {
  comm(axis);
  return axis == kAllAxes ? size() : shape_[static_cast<std::size_t>(axis)];
}

int MeshDevice::axis_index(int axis) const {
  comm(axis);
  if (axis == kAllAxes) return id_;
  return coord()[static_cast<std::size_t>(axis)];
}

std::string MeshDevice::str() const { return fmt::format("{}x{}", shape_[0], shape_[1]); }

}  // namespace meshtest::dist
