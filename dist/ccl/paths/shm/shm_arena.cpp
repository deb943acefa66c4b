// shm_arena: the shared-memory path's collectives over inputs (and all_reduce's outputs) in the
// node arena, read and written where they lie (shm.hpp; arena.hpp). all_reduce with heap outputs,
// whose reduced parts go through the slots, stays in shm.cpp with the window's all_reduce.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dist/ccl/arena/arena.hpp"
#include "dist/ccl/copy.hpp"
#include "dist/ccl/paths/shm/shm.hpp"
#include "dist/ccl/reduce.hpp"
#include "src/core/shape.hpp"

namespace meshtest::dist::detail {

std::vector<std::byte*> ShmGroup::in_arena(const std::vector<std::uint64_t>& handles) const {
  const NodeArena* arena = NodeArena::get();
  std::vector<std::byte*> at;
  if (arena == nullptr) return at;
  for (std::size_t j = 0; j < handles.size(); ++j) {
    std::byte* b = handles[j] == kNoHandle ? nullptr : arena->at(world_[j], handles[j]);
    if (b == nullptr) return {};
    at.push_back(b);
  }
  return at;
}

std::vector<const std::byte*> ShmGroup::arena_inputs() const {
  const std::vector<std::byte*> at = in_arena(handles_);
  return {at.begin(), at.end()};
}

std::vector<std::byte*> ShmGroup::arena_outputs() const { return in_arena(out_handles_); }

void ShmGroup::arena_all_gather(const std::vector<const std::byte*>& peers,
                                const BlockLayout& layout, std::byte* out, std::size_t piece) {
  const bool stream = piece * static_cast<std::size_t>(size_) >= kStreamOutput;
  step([](std::size_t) {},
       [&](std::size_t) {
         for (int j = 0; j < size_; ++j) {
           layout.unpack_range(peers[static_cast<std::size_t>(j)], static_cast<std::size_t>(j), 0,
                               piece, out, stream);
           if (j != index_) read_ += piece;
         }
       });
  finish();
}

void ShmGroup::arena_reduce_scatter(const std::vector<const std::byte*>& peers, std::byte* out,
                                    std::int64_t n, DType t, ReduceOp op) {
  const std::size_t block = static_cast<std::size_t>(n) * dtype_size(t);
  for (int j = 0; j < size_; ++j) {
    terms_[static_cast<std::size_t>(j)] =
        peers[static_cast<std::size_t>(j)] + static_cast<std::size_t>(index_) * block;
  }
  step([](std::size_t) {},
       [&](std::size_t) {
         reduce(out, terms_, n, t, op);
         read_ += static_cast<std::uint64_t>(size_ - 1) * block;
       });
  finish();
}

void ShmGroup::arena_all_to_all(const std::vector<const std::byte*>& peers, const BlockLayout& recv,
                                std::byte* out, std::size_t block) {
  if (block == 0) return;  // empty tensors: no step on any device
  const std::size_t me = static_cast<std::size_t>(index_) * block;
  const bool stream = block * static_cast<std::size_t>(size_) >= kStreamOutput;
  step([](std::size_t) {},
       [&](std::size_t) {
         for (int j = 0; j < size_; ++j) {
           recv.unpack_range(peers[static_cast<std::size_t>(j)] + me, static_cast<std::size_t>(j),
                             0, block, out, stream);
           if (j != index_) read_ += block;
         }
       });
  finish();
}

void ShmGroup::arena_all_reduce_to(const std::vector<const std::byte*>& peers,
                                   const std::vector<std::byte*>& outs, std::int64_t n, DType t,
                                   ReduceOp op) {
  // Device i owns part i of the n elements (the array_split rule): it reduces the part from
  // every input, a tile at a time, into its own output, and copies each reduced tile into the
  // others' outputs while it is still in cache. Nobody else reads or writes part i of any
  // input or output, so an output that is its device's input (in place) is overwritten only
  // after its tile has been read.
  const std::size_t e = dtype_size(t);
  const Range part = split_range(n, size_, index_);
  const auto tile = static_cast<std::int64_t>(kOutTile / e);
  const bool stream = static_cast<std::size_t>(n) * e >= kStreamOutput;
  std::byte* const mine = outs[static_cast<std::size_t>(index_)];
  step([](std::size_t) {},
       [&](std::size_t) {
         for (std::int64_t at = part.start; at < part.start + part.size; at += tile) {
           const std::int64_t len = std::min(tile, part.start + part.size - at);
           const std::size_t off = static_cast<std::size_t>(at) * e;
           const std::size_t bytes = static_cast<std::size_t>(len) * e;
           for (int j = 0; j < size_; ++j)
             terms_[static_cast<std::size_t>(j)] = peers[static_cast<std::size_t>(j)] + off;
           reduce(mine + off, terms_, len, t, op, static_cast<std::size_t>(n) * e);
           for (int j = 0; j < size_; ++j) {
             if (j == index_) continue;
             std::byte* to = outs[static_cast<std::size_t>(j)] + off;
             if (stream) {
               copy_streaming(to, mine + off, bytes, /*fence=*/false);
             } else {
               copy_bytes(to, mine + off, bytes);
             }
           }
           read_ += static_cast<std::uint64_t>(size_ - 1) * bytes;
           written_ += static_cast<std::uint64_t>(size_ - 1) * bytes;
         }
         if (stream) store_fence();  // before the step publishes the outputs
       });
  finish();
}

}  // namespace meshtest::dist::detail
