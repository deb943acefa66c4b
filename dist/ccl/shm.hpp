// shm: the intra-node shared-memory path of the collectives (MPI-3 shared windows).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "dist/ccl/block_layout.hpp"
#include "dist/ccl/options.hpp"
#include "dist/ccl/reduce.hpp"
#include "src/core/dtype.hpp"
#include "src/core/shape.hpp"

namespace meshtest::dist::detail {

/// A communicator's devices, all on one node, exchanging through one MPI-3 shared window
/// (MPI_Win_allocate_shared): each device owns a segment of kSlots slots of kChunk bytes and
/// two step counters. A collective is a sequence of steps; in step g every device waits until
/// slot g % kSlots is free (every device has consumed step g - kSlots), writes its part into
/// its own slot, publishes `ready = g + 1` (release), waits until every device is ready
/// (acquire) and reads what it needs from every device's slot, then publishes `done = g + 1`.
/// Large messages stream through the ring chunk by chunk while the chunks stay in cache;
/// there is one copy in and one copy (or reduction) out, and no MPI call per step.
///
/// The agreement of a call (Call::agree) is itself a step: every device writes its signature
/// hash and error flag, and every device reads all of them, so all decide alike whether the
/// group agrees (on a mismatch Call falls back to the full MPI metadata exchange and its
/// detailed error). Every device runs the same steps for the same agreed call, so the step
/// counters never diverge.
///
/// Reductions go through detail::reduce (reduce.hpp): x_0 op x_1 op ... op x_{p-1} in axis
/// order, bf16 accumulated in f32 and rounded once. all_reduce is a reduce-scatter inside the
/// window (device i reduces part i of every chunk) followed by an all-gather of the reduced
/// parts, pipelined one chunk apart so each step carries both; every element is reduced once,
/// on one device, so the outputs are equal bit for bit across devices and to the MPI path's.
/// A device's own block never goes through its slots (all_to_all, reduce_scatter, all_reduce
/// read it from the input), so per call and device the bytes written into the window and
/// read from other devices' slots are the bandwidth minimum: all_reduce writes S and reads
/// 2(p-1)/p·S, all_gather writes S/p and reads (p-1)/p·S of the output S, all_to_all and
/// reduce_scatter write and read (p-1)/p·S of the input S (traffic() counts them).
///
/// Waiting spins (x86 pause) and then yields; when the node holds more ranks than cores
/// (mpirun --oversubscribe) it yields at once and steps move whole slots (fewer steps, fewer
/// context switches); otherwise steps move a quarter slot (measured best on 2 ranks). A device that
/// never arrives leaves the others waiting inside the collective, where the test harness's watchdog
/// sees them, as it sees a rank waiting inside an MPI collective.
class ShmGroup {
 public:
  static constexpr std::size_t kSlots = 4;
  /// From this many devices on, steps move whole slots (see chunk()), and all_to_all leaves
  /// blocks of kSingleCopyBlock bytes or more to MPI (see window_all_to_all()).
  static constexpr int kManyDevices = 8;
  static constexpr std::size_t kSingleCopyBlock = std::size_t{16} << 10;
  static constexpr std::size_t kChunk = std::size_t{512} << 10;  ///< bytes per slot
  /// Bytes a step moves per device: a quarter slot, so the ring stays in cache, unless the
  /// node is oversubscribed, where each step costs context switches, or the group has
  /// kManyDevices or more: then a whole slot.
  /// MESHTEST_CCL_SHM_CHUNK (bytes, 4096 to kChunk) overrides it for tuning; the devices take
  /// the largest value any of them asks for. all_reduce uses at most half a slot (the other
  /// half holds the reduced part).
  std::size_t chunk() const { return chunk_; }

  /// What this device has moved through the window since the group was made: steps (the
  /// agreement steps included), bytes written into its own slots and bytes read from other
  /// devices' slots. The bench divides the difference over a run by its calls.
  struct Traffic {
    std::uint64_t steps = 0, written = 0, read = 0;
  };
  Traffic traffic() const { return {steps_, written_, read_}; }

  /// The group of `comm`, or nullptr when it has none (not made yet, turned off, or its
  /// devices span nodes). Local: an attribute lookup.
  static ShmGroup* find(MPI_Comm comm);
  /// Collective over `comm` (every device must call it at the same point, as Call::agree does
  /// after a successful agreement); does nothing after the first call for `comm`. Makes the
  /// group when `comm` has more than one device, all of them share a node and every device
  /// has the path enabled (see enabled()); otherwise records that `comm` has none.
  static void establish(MPI_Comm comm);
  /// Collective over `comm`: whether all its devices share one node (MPI_COMM_TYPE_SHARED:
  /// Open MPI's node, one host). A group that spans nodes has no shared-memory group; its
  /// CCLs take the MPI path.
  static bool one_node(MPI_Comm comm);
  /// Collective over `comm`: the devices of comm on this device's node, ordered by `key`
  /// (MPI_Comm_split_type MPI_COMM_TYPE_SHARED: Open MPI's node, one host). For tests and
  /// benches on one machine, a node size q > 0 (set_node_size_for_testing, or the environment
  /// variable MESHTEST_CCL_TEST_NODE_SIZE) makes every q consecutive ranks of comm a node
  /// instead; then neither one_node() nor establish() sees one node, and the node chain of
  /// node_chain.hpp runs, all through shared memory.
  static MPI_Comm split_node(MPI_Comm comm, int key);
  static void set_node_size_for_testing(int q);
  /// Whether this process makes groups for communicators established from now on: the
  /// environment variable MESHTEST_CCL_SHM (0 turns the path off; default on), unless
  /// set_enabled() overrode it. Devices that disagree get no group (agreed at establish).
  static bool enabled();
  static void set_enabled(bool on);

  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;
  ~ShmGroup();

  int size() const { return size_; }
  int index() const { return index_; }

  /// One step: true when every device passed the same hash and no device an error.
  bool agree(std::uint64_t hash, bool error);
  /// out = x_0 op ... op x_{p-1} over `n` elements of `t` (out may be in); avg sums (the
  /// caller divides). t must not be u8.
  void all_reduce(const std::byte* in, std::byte* out, std::int64_t n, DType t, ReduceOp op);
  /// out = the `piece` bytes of device 0, then device 1's, ...
  /// out = every device's `piece` bytes (this device's at `in`, contiguous) placed as block j
  /// of `layout` (the pieces along the gathered dim: strided when that dim is not leading,
  /// written straight from the slots, no unpack pass).
  void all_gather(const std::byte* in, const BlockLayout& layout, std::byte* out,
                  std::size_t piece);
  /// Whether all_to_all of `block`-byte blocks should go through the window. The window copies
  /// every byte twice (into the slot, out of it); Open MPI's shared-memory transport moves a
  /// large contiguous message once (single copy, CMA), which wins from about 16 KiB blocks at
  /// 8 and 16 devices (bench ccl on a 16-core node: 0.65-0.89 x MPI_Alltoall through the window
  /// at 256 KiB-64 MiB). So from kManyDevices devices, blocks of kSingleCopyBlock bytes or more
  /// take MPI_Alltoall on contiguous blocks; below that, or with fewer devices, the window.
  /// Strided blocks (`strided`: a dim that is not leading) always take the window: it packs
  /// and unpacks them on the way into and out of the slots, where MPI would need a pack and an
  /// unpack pass besides its copy.
  bool window_all_to_all(std::size_t block, bool strided) const {
    return strided || size_ < kManyDevices || block < kSingleCopyBlock;
  }
  /// Block j of `send` over `in` (`block` bytes as packed) goes to device j, where it becomes
  /// block index() of `recv` over `out`: each side strided or not, packed and unpacked range by
  /// range straight between the tensor and the slots.
  void all_to_all(const BlockLayout& send, const std::byte* in, const BlockLayout& recv,
                  std::byte* out, std::size_t block);
  /// out = block `index()` (n elements of t) of x_0 op ... op x_{p-1}, where in holds p such
  /// blocks end to end.
  void reduce_scatter(const std::byte* in, std::byte* out, std::int64_t n, DType t, ReduceOp op);

  /// The two halves of the node chain's all_reduce (node_chain.hpp) on this node. The n
  /// elements go in chunks of `per` (the last one shorter); chunk g is split into size() parts
  /// by the array_split rule and device j owns part j of every chunk. `per` elements of t must
  /// fit half a slot.
  struct PartStage {
    std::byte* dst = nullptr;  ///< where the part's reduction goes (see Stage::last)
    Stage stage;
  };
  /// Device j reduces part j of each chunk g over the group's inputs, in axis order, as the
  /// stage that `stage(g, part)` returns (called after every device has put chunk g into the
  /// window: it may wait there for the carry), then calls done(g).
  void reduce_parts(const std::byte* in, std::int64_t n, std::int64_t per, DType t, ReduceOp op,
                    const std::function<PartStage(std::int64_t g, const Range& part)>& stage,
                    const std::function<void(std::int64_t g)>& done);
  /// In place: every device's part of every chunk, at its place in out, reaches every device.
  /// ready(g) returns once this device's part of chunk g is in out; a step carries the parts of
  /// as many chunks as fit a slot.
  void gather_parts(std::byte* out, std::int64_t n, std::int64_t per, std::size_t e,
                    const std::function<void(std::int64_t g)>& ready);

 private:
  ShmGroup(MPI_Comm node, bool oversubscribed);
  template <class Write, class Read>
  void step(const Write& write, const Read& read);
  /// Steps that carry the next piece of each of the p blocks of `block` bytes (block j for
  /// device j; this device's own block stays out of the slots): pack(j, off, len, dst) copies
  /// bytes [off, off + len) of block j to dst; read(s, off, len, at) finds device j's piece
  /// for this device at slot(j, s) + at.
  template <class Pack, class Read>
  void exchange_blocks(std::size_t block, const Pack& pack, const Read& read);
  /// dst = the n elements at `at` of every device's slot s (this device's own term from
  /// `own` instead), reduced in axis order (as a stage of a longer reduction when given).
  void reduce_slots(std::byte* dst, const std::byte* own, std::size_t s, std::size_t at,
                    std::size_t n, DType t, ReduceOp op, const Stage* stage = nullptr);
  void wait_all(std::size_t counter, std::uint64_t target) const;
  /// Copies into this device's slot s at `at`, counted as written.
  void put(std::size_t s, std::size_t at, const std::byte* from, std::size_t len);
  /// Copies from device j's slot s at `at`, counted as read unless j is this device.
  void get(std::byte* to, int j, std::size_t s, std::size_t at, std::size_t len);
  std::atomic<std::uint64_t>& counter(int device, std::size_t which) const;
  std::byte* header(int device, std::size_t slot) const;
  std::byte* slot(int device, std::size_t slot) const;

  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  int size_ = 1;
  int index_ = 0;
  bool yield_ = false;
  std::size_t chunk_ = kChunk;
  std::vector<std::byte*> base_;  // every device's segment
  std::uint64_t steps_ = 0;       // steps this device has begun
  std::uint64_t written_ = 0, read_ = 0;
  std::vector<const std::byte*> terms_;  // reduce()'s p inputs
  std::vector<std::byte> scratch_;       // a strided own block on its way from in to out
};

}  // namespace meshtest::dist::detail
