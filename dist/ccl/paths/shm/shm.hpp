// shm: the intra-node shared-memory path of the collectives: all_reduce, all_gather, all_to_all,
// reduce_scatter and the node chain's halves, streamed in chunks through the slot ring of an
// MPI-3 shared window (shm_window.hpp).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "dist/ccl/block_layout.hpp"
#include "dist/ccl/options.hpp"
#include "dist/ccl/paths/shm/shm_window.hpp"
#include "dist/ccl/reduce.hpp"
#include "src/core/dtype.hpp"
#include "src/core/shape.hpp"

namespace meshtest::dist::detail {

/// The collectives of a communicator whose devices share a node, over its ShmWindow (the
/// window, the steps and the agreement step: shm_window.hpp). Large messages stream through
/// the ring chunk by chunk while the chunks stay in cache; there is one copy in and one copy
/// (or reduction) out, and no MPI call per step.
///
/// Reductions go through detail::reduce (reduce.hpp): x_0 op x_1 op ... op x_{p-1} in axis
/// order, bf16 and f16 accumulated in f32 and rounded once. all_reduce is a reduce-scatter inside
/// the window (device i reduces part i of every chunk) followed by an all-gather of the reduced
/// parts, pipelined one chunk apart so each step carries both; every element is reduced once,
/// on one device, so the outputs are equal bit for bit across devices and to the MPI path's.
/// A device's own block never goes through its slots (all_to_all, reduce_scatter, all_reduce
/// read it from the input), so per call and device the bytes written into the window and
/// read from other devices' slots are the bandwidth minimum: all_reduce writes S and reads
/// 2(p-1)/p·S, all_gather writes S/p and reads (p-1)/p·S of the output S, all_to_all and
/// reduce_scatter write and read (p-1)/p·S of the input S (traffic() counts them).
class ShmGroup : public ShmWindow {
 public:
  /// From kManyDevices devices on, all_to_all leaves blocks of this many bytes or more to MPI
  /// (see window_all_to_all()).
  static constexpr std::size_t kSingleCopyBlock = std::size_t{16} << 10;

  /// The group of `comm`, or nullptr when it has none (not made yet, turned off, or its
  /// devices span nodes). Local: an attribute lookup.
  static ShmGroup* find(MPI_Comm comm);
  /// Collective over `comm` (every device must call it at the same point, as Call::agree does
  /// after a successful agreement); does nothing after the first call for `comm`. Makes the
  /// group when `comm` has more than one device, all of them share a node and every device
  /// has the path enabled (see enabled()); otherwise records that `comm` has none.
  static void establish(MPI_Comm comm);

  /// out = x_0 op ... op x_{p-1} over `n` elements of `t` (out may be in); avg sums (the
  /// caller divides). t must not be u8.
  void all_reduce(const std::byte* in, std::byte* out, std::int64_t n, DType t, ReduceOp op);
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

  /// In place (arena.hpp): where every device's input of the call just agreed lies in this
  /// process, when every one lies in the node arena; empty otherwise (the same on every
  /// device: the handles come from the agreement step).
  std::vector<const std::byte*> arena_inputs() const;
  /// Where every device's output of the call just agreed lies in this process, when the call
  /// announced its output (Agreement::out) and every one lies in the node arena; else empty.
  std::vector<std::byte*> arena_outputs() const;
  /// The collectives above, reading each device's input where it lies (`peers`, from
  /// arena_inputs()) instead of through the slots: one pass over the bytes. Each starts with a
  /// step (every device has arrived, so every input is ready) and ends when every device has
  /// read what it needs from this device's input (the caller may then write it). The sums are
  /// detail::reduce's, in axis order, as above: the same bits.
  ///   arena_all_gather: every device's `piece` bytes placed as block j of `layout` in out;
  ///   arena_reduce_scatter: out = block index() (n elements) of the reduction of the peers'
  ///     inputs, each p such blocks end to end;
  ///   arena_all_to_all: block index() of device j's input (`block` bytes, contiguous blocks
  ///     end to end) becomes block j of `recv` over out;
  ///   arena_all_reduce: out = the reduction of the peers' n-element inputs (out may be this
  ///     device's input): device i reduces part i of each chunk from the inputs in place, and
  ///     the reduced parts reach the others through the slots, a chunk behind;
  ///   arena_all_reduce_to: the same when every output is in the arena too (`outs`, from
  ///     arena_outputs(); an output may be its device's input): device i reduces part i of the
  ///     whole message in tiles of kOutTile bytes and writes each tile into every output, so
  ///     each device reads S and writes S, as memcpy does, in one step.
  void arena_all_gather(const std::vector<const std::byte*>& peers, const BlockLayout& layout,
                        std::byte* out, std::size_t piece);
  void arena_reduce_scatter(const std::vector<const std::byte*>& peers, std::byte* out,
                            std::int64_t n, DType t, ReduceOp op);
  void arena_all_to_all(const std::vector<const std::byte*>& peers, const BlockLayout& recv,
                        std::byte* out, std::size_t block);
  void arena_all_reduce(const std::vector<const std::byte*>& peers, std::byte* out, std::int64_t n,
                        DType t, ReduceOp op);
  void arena_all_reduce_to(const std::vector<const std::byte*>& peers,
                           const std::vector<std::byte*>& outs, std::int64_t n, DType t,
                           ReduceOp op);
  /// arena_all_reduce_to's tile: small enough that the reduced tile is still in L1 when it is
  /// copied to the other devices' outputs.
  static constexpr std::size_t kOutTile = std::size_t{16} << 10;

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
  explicit ShmGroup(MPI_Comm node);
  /// Where each device's `handles` entry lies in this process, or empty unless all do.
  std::vector<std::byte*> in_arena(const std::vector<std::uint64_t>& handles) const;
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

  std::vector<const std::byte*> terms_;  // reduce()'s p inputs
  std::vector<int> world_;               // every device's rank in MPI_COMM_WORLD
  std::vector<std::byte> scratch_;       // a strided own block on its way from in to out
};

}  // namespace meshtest::dist::detail
