// MeshDevice: MPI ranks as the devices of a 1-D or 2-D mesh, with axis communicators.
#pragma once

#include <mpi.h>

#include <array>
#include <string>
#include <vector>

namespace meshtest::dist {

/// Axis argument of a CCL: 0 = the devices of one column (same c), 1 = the
/// devices of one row (same r), kAllAxes = every device of the mesh.
inline constexpr int kAllAxes = -1;

/// A rows x cols mesh of devices over a communicator (default MPI_COMM_WORLD).
/// Device id is row-major: id = r * cols + c, and equals the rank in comm().
/// A 1-D mesh {N} is the 1 x N mesh. Construction is collective over the
/// communicator; it throws meshtest::Error when rows * cols differs from the
/// communicator's size or a dim is not positive.
class MeshDevice {
 public:
  explicit MeshDevice(std::vector<int> shape, MPI_Comm parent = MPI_COMM_WORLD);
  /// The 1 x N mesh over every rank of `parent`.
  static MeshDevice line(MPI_Comm parent = MPI_COMM_WORLD);
  ~MeshDevice();
  MeshDevice(const MeshDevice&) = delete;
  MeshDevice& operator=(const MeshDevice&) = delete;
  MeshDevice(MeshDevice&& other) noexcept;
  MeshDevice& operator=(MeshDevice&& other) noexcept;

  int rows() const { return shape_[0]; }
  int cols() const { return shape_[1]; }
  std::array<int, 2> shape() const { return shape_; }
  /// Number of devices (rows * cols).
  int size() const { return shape_[0] * shape_[1]; }
  /// This device's id (row-major), equal to its rank in comm().
  int device_id() const { return id_; }
  /// This device's (r, c).
  std::array<int, 2> coord() const { return {id_ / shape_[1], id_ % shape_[1]}; }
  /// Device id of (r, c).
  int device_at(int r, int c) const;

  /// The whole mesh's communicator (kAllAxes) or an axis communicator.
  /// Throws meshtest::Error naming the axis if it is not 0, 1 or kAllAxes.
  MPI_Comm comm(int axis = kAllAxes) const;
  /// Number of devices in this device's group along `axis`.
  int axis_size(int axis) const;
  /// This device's index within its group along `axis`.
  int axis_index(int axis) const;

  /// "2x4"
  std::string str() const;

 private:
  void release() noexcept;
  std::array<int, 2> shape_{1, 1};
  int id_ = 0;
  MPI_Comm all_ = MPI_COMM_NULL;
  std::array<MPI_Comm, 2> axis_{MPI_COMM_NULL, MPI_COMM_NULL};
};

/// Where a MeshDevice's communicators go when it is destroyed: nullptr (the default) frees them
/// at once; a keeper takes them instead and frees them later. The test harness sets one for
/// the length of each test and frees what it kept after the test's verdict, when every rank has
/// left the test body: freeing a communicator runs its paths' teardown (shared windows, NCCL
/// communicators), which is collective and would block a rank whose test ended while others
/// still wait in a collective it skipped. Main thread only.
using CommKeeper = void (*)(MPI_Comm comm);
void set_comm_keeper(CommKeeper keeper) noexcept;

}  // namespace meshtest::dist
