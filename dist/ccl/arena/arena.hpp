// arena: a node-wide shared-memory arena for host tensors that the collectives read in place.
//
// On one node the CCLs' shared-memory path (paths/shm) copies every device's input into its
// slots of a shared window before the others read it: two passes over the bytes where threads
// sharing an address space (JAX's host-platform devices, say) make one. A tensor allocated in
// the arena lies in memory every device of its node has mapped, so when every device of a
// group passes one, the path reads each peer's input where it lies (paths/shm/shm.hpp,
// ShmGroup's arena_* collectives): one pass, and the same bits as every other path.
//
//   dist::NodeArena& arena = dist::NodeArena::open(256 << 20);  // collective, once per job
//   Tensor x(Shape{rows, cols}, DType::f32, arena);               // zero-filled, in the arena
//   all_reduce_inplace(mesh, x, {.axis = 1});                     // read in place
//
// Moves keep a tensor in the arena; copies, slices and ops' results are ordinary heap tensors.
// A group where any device passes a heap tensor takes the usual path, on every device alike.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Every device's segment of one MPI-3 shared window over the devices of MPI_COMM_WORLD on
/// its node, each mapped by all of them. A device allocates only from its own segment (first
/// fit, 64-byte aligned, under a lock); the others find its tensors by offset.
class NodeArena final : public MemoryResource {
 public:
  /// Collective over MPI_COMM_WORLD: opens the arena with `bytes_per_device` (rounded up to
  /// pages) on every device; the largest any device asks for wins. Throws the same Error on
  /// every device when one is already open, the size is 0, or /dev/shm cannot hold the node's
  /// segments (a container's default 64 MiB, say: the message says how much it has).
  static NodeArena& open(std::size_t bytes_per_device);
  /// The open arena, or nullptr. Local.
  static NodeArena* get();
  /// Collective over MPI_COMM_WORLD: frees the window (the job's end does it too). Tensors still
  /// in it must not be read after this; freeing them later is harmless.
  static void close();
  /// Local: from now on every tensor that names no resource is allocated in the open arena
  /// while it has room, else on the heap (set_default_memory_resource): every CCL input of the
  /// program then lies in the arena. The MPI test harness does this under
  /// MESHTEST_CCL_ARENA=<bytes per device> (K, M, G), so that a whole test binary runs on the
  /// in-place path. Throws Error when no arena is open.
  static void use_for_all_tensors();

  NodeArena(const NodeArena&) = delete;
  NodeArena& operator=(const NodeArena&) = delete;
  ~NodeArena() override;

  /// Throws Error "node arena: no room for N bytes (F of T free, largest hole H)".
  void* allocate(std::size_t bytes) override;
  /// allocate(), or nullptr when there is no room.
  void* try_allocate(std::size_t bytes);
  void deallocate(void* p, std::size_t bytes) noexcept override;

  /// The offset of [p, p + len) in this device's segment, when it lies there entirely.
  std::optional<std::uint64_t> offset_of(const void* p, std::size_t len) const;
  /// The offset of [p, p + len) in this device's segment of the open arena, when there is
  /// one and the bytes lie there entirely. Local.
  static std::optional<std::uint64_t> offset_in_open(const void* p, std::size_t len);
  /// Where `offset` of the segment of the device with world rank `world_rank` lies in this
  /// process, or nullptr when that device is not on this node.
  std::byte* at(int world_rank, std::uint64_t offset) const;
  /// Bytes of each segment, and bytes of this device's segment in use.
  std::size_t capacity() const { return bytes_; }
  std::size_t in_use() const;

 private:
  NodeArena(MPI_Comm node, std::size_t bytes);

  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  std::size_t bytes_ = 0;
  std::byte* mine_ = nullptr;
  std::map<int, std::byte*> base_;           // world rank -> its segment, here
  mutable std::mutex lock_;                  // allocate / deallocate from any thread
  std::map<std::size_t, std::size_t> free_;  // offset -> size of each hole
  std::size_t used_ = 0;
};

}  // namespace meshtest::dist
