// shm: collectives through an MPI-3 shared window, streamed in chunks through a slot ring.
#include "dist/ccl/paths/shm/shm.hpp"

#include <algorithm>
#include <cstring>
#include <memory>

#include "dist/ccl/private_comm.hpp"
#include "dist/ccl/reduce.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/core/shape.hpp"

namespace meshtest::dist::detail {
namespace {

/// Attribute of a communicator: present once establish() ran for it; holds the group or null
/// (~ShmGroup frees the window, collectively, as the communicator is freed).
struct EstablishedWindow {
  std::unique_ptr<ShmGroup> group;
};

EstablishedWindow* established(MPI_Comm comm) {
  return CommAttribute<EstablishedWindow>::find(comm);
}

/// all_reduce's chunks of `per` elements of n (the last one shorter), each split into p parts
/// by the array_split rule: part(g, j) is part j of chunk g, offset in the chunk; at(g, r) the
/// byte offset of range r of chunk g in the vector.
struct Chunks {
  std::int64_t n, per;
  int p;
  std::size_t e;
  std::int64_t count() const { return (n + per - 1) / per; }
  Range part(std::int64_t g, int j) const { return split_range(std::min(per, n - g * per), p, j); }
  std::size_t at(std::int64_t g, const Range& r) const {
    return static_cast<std::size_t>(g * per + r.start) * e;
  }
};

}  // namespace

ShmGroup* ShmGroup::find(MPI_Comm comm) {
  EstablishedWindow* e = established(comm);
  return e != nullptr ? e->group.get() : nullptr;
}

void ShmGroup::establish(MPI_Comm comm) {
  if (established(comm) != nullptr) return;
  auto e = std::make_unique<EstablishedWindow>();
  const MPI_Comm node = shared_node(comm);
  if (node != MPI_COMM_NULL) e->group.reset(new ShmGroup(node));
  CommAttribute<EstablishedWindow>::attach(comm, std::move(e));
}

ShmGroup::ShmGroup(MPI_Comm node) : ShmWindow(node) {
  terms_.resize(static_cast<std::size_t>(size_));
  world_.resize(static_cast<std::size_t>(size_));
  int rank = 0;
  MESHTEST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MESHTEST_MPI(MPI_Allgather(&rank, 1, MPI_INT, world_.data(), 1, MPI_INT, node));
}

void ShmGroup::arena_all_reduce(const std::vector<const std::byte*>& peers, std::byte* out,
                                std::int64_t n, DType t, ReduceOp op) {
  // Chunk g (elements [g*per, g*per + len)) is split by the array_split rule; device j reduces
  // part j, reading it from every input in place, into its out. Step g publishes the reduced
  // part of chunk g-1 in the slot, reduces part `index` of chunk g and copies the others'
  // parts of chunk g-1 from their slots: chunks + 1 steps. When out is this device's input,
  // step g overwrites the others' parts of chunk g-1 only after every device has finished step
  // g-1, the last that reads them.
  const std::size_t e = dtype_size(t);
  // A part fits the slot.
  const Chunks c{.n = n, .per = static_cast<std::int64_t>(chunk_ / e) * size_, .p = size_, .e = e};
  const std::int64_t chunks = c.count();
  const auto part = [&](std::int64_t g, int j) { return c.part(g, j); };
  const auto at = [&](std::int64_t g, const Range& r) { return c.at(g, r); };
  for (std::int64_t g = 0; g <= chunks; ++g) {
    step(
        [&](std::size_t s) {
          if (g > 0) {
            const Range r = part(g - 1, index_);
            put(s, 0, out + at(g - 1, r), static_cast<std::size_t>(r.size) * e);
          }
        },
        [&](std::size_t s) {
          if (g < chunks) {
            const Range r = part(g, index_);
            for (int j = 0; j < size_; ++j)
              terms_[static_cast<std::size_t>(j)] = peers[static_cast<std::size_t>(j)] + at(g, r);
            reduce(out + at(g, r), terms_, r.size, t, op);
            read_ += static_cast<std::uint64_t>(size_ - 1) * static_cast<std::uint64_t>(r.size) * e;
          }
          for (int j = 0; g > 0 && j < size_; ++j) {
            const Range r = part(g - 1, j);
            if (j != index_) get(out + at(g - 1, r), j, s, 0, static_cast<std::size_t>(r.size) * e);
          }
        });
  }
}

void ShmGroup::all_reduce(const std::byte* in, std::byte* out, std::int64_t n, DType t,
                          ReduceOp op) {
  // Chunk g (elements [g*per, g*per + len)) is split by the array_split rule; device j reduces
  // part j. Step g writes the other parts of chunk g into the slot's first half and the
  // reduced part of chunk g-1 into its second half, then reduces part `index` of chunk g and
  // gathers the reduced parts of chunk g-1: chunks + 1 steps.
  const std::size_t e = dtype_size(t);
  const std::size_t half = kChunk / 2;
  const Chunks c{
      .n = n, .per = static_cast<std::int64_t>(std::min(chunk_, half) / e), .p = size_, .e = e};
  const std::int64_t chunks = c.count();
  const auto part = [&](std::int64_t g, int j) { return c.part(g, j); };
  const auto at = [&](std::int64_t g, const Range& r) { return c.at(g, r); };
  for (std::int64_t g = 0; g <= chunks; ++g) {
    step(
        [&](std::size_t s) {
          if (g > 0) {
            const Range r = part(g - 1, index_);
            put(s, half, out + at(g - 1, r), static_cast<std::size_t>(r.size) * e);
          }
          for (int j = 0; g < chunks && j < size_; ++j) {
            const Range r = part(g, j);
            if (j != index_) {
              put(s, static_cast<std::size_t>(r.start) * e, in + at(g, r),
                  static_cast<std::size_t>(r.size) * e);
            }
          }
        },
        [&](std::size_t s) {
          if (g < chunks) {
            const Range r = part(g, index_);
            reduce_slots(out + at(g, r), in + at(g, r), s, static_cast<std::size_t>(r.start) * e,
                         static_cast<std::size_t>(r.size), t, op);
          }
          for (int j = 0; g > 0 && j < size_; ++j) {
            const Range r = part(g - 1, j);
            if (j != index_)
              get(out + at(g - 1, r), j, s, half, static_cast<std::size_t>(r.size) * e);
          }
        });
  }
}

void ShmGroup::all_gather(const std::byte* in, const BlockLayout& layout, std::byte* out,
                          std::size_t piece) {
  const auto me = static_cast<std::size_t>(index_);
  layout.unpack_range(in, me, 0, piece, out);
  for (std::size_t off = 0; off < piece; off += chunk_) {
    const std::size_t len = std::min(chunk_, piece - off);
    step([&](std::size_t s) { put(s, 0, in + off, len); },
         [&](std::size_t s) {
           for (int j = 0; j < size_; ++j) {
             if (j == index_) continue;
             layout.unpack_range(slot(j, s), static_cast<std::size_t>(j), off, len, out);
             read_ += len;
           }
         });
  }
}

template <class Pack, class Read>
void ShmGroup::exchange_blocks(std::size_t block, const Pack& pack, const Read& read) {
  const auto p = static_cast<std::size_t>(size_);
  const std::size_t sub = chunk_ / p / kLine * kLine;  // bytes of each block per step
  for (std::size_t off = 0; off < block; off += sub) {
    const std::size_t len = std::min(sub, block - off);
    step(
        [&](std::size_t s) {
          for (std::size_t j = 0; j < p; ++j) {
            if (j == static_cast<std::size_t>(index_)) continue;
            pack(j, off, len, slot(index_, s) + j * sub);
            written_ += len;
          }
        },
        [&](std::size_t s) { read(s, off, len, static_cast<std::size_t>(index_) * sub); });
  }
}

void ShmGroup::reduce_slots(std::byte* dst, const std::byte* own, std::size_t s, std::size_t at,
                            std::size_t n, DType t, ReduceOp op, const Stage* stage) {
  for (int j = 0; j < size_; ++j) {
    terms_[static_cast<std::size_t>(j)] = j == index_ ? own : slot(j, s) + at;
    if (j != index_) read_ += n * dtype_size(t);
  }
  if (stage != nullptr) {
    reduce_stage(dst, terms_, static_cast<std::int64_t>(n), t, op, *stage);
  } else {
    reduce(dst, terms_, static_cast<std::int64_t>(n), t, op);
  }
}

void ShmGroup::all_to_all(const BlockLayout& send, const std::byte* in, const BlockLayout& recv,
                          std::byte* out, std::size_t block) {
  if (block == 0) return;  // empty tensors (null buffers): no step on any device
  const auto me = static_cast<std::size_t>(index_);
  if (send.direct() && recv.direct()) {
    std::memcpy(out + me * block, in + me * block, block);
  } else {  // the own block, strided on either side, through a chunk of scratch
    scratch_.resize(std::min(block, chunk_));
    for (std::size_t off = 0; off < block; off += scratch_.size()) {
      const std::size_t len = std::min(scratch_.size(), block - off);
      send.pack_range(in, me, off, len, scratch_.data());
      recv.unpack_range(scratch_.data(), me, off, len, out);
    }
  }
  exchange_blocks(
      block,
      [&](std::size_t j, std::size_t off, std::size_t len, std::byte* to) {
        send.pack_range(in, j, off, len, to);
      },
      [&](std::size_t s, std::size_t off, std::size_t len, std::size_t at) {
        for (int j = 0; j < size_; ++j) {
          if (j == index_) continue;
          recv.unpack_range(slot(j, s) + at, static_cast<std::size_t>(j), off, len, out);
          read_ += len;
        }
      });
}

void ShmGroup::reduce_scatter(const std::byte* in, std::byte* out, std::int64_t n, DType t,
                              ReduceOp op) {
  const std::size_t e = dtype_size(t);
  const std::size_t block = static_cast<std::size_t>(n) * e;
  const std::byte* own = in + static_cast<std::size_t>(index_) * block;
  exchange_blocks(
      block,
      [&](std::size_t j, std::size_t off, std::size_t len, std::byte* to) {
        std::memcpy(to, in + j * block + off, len);
      },
      [&](std::size_t s, std::size_t off, std::size_t len, std::size_t at) {
        reduce_slots(out + off, own + off, s, at, len / e, t, op);
      });
}

void ShmGroup::reduce_parts(
    const std::byte* in, std::int64_t n, std::int64_t per, DType t, ReduceOp op,
    const std::function<PartStage(std::int64_t g, const Range& part)>& stage,
    const std::function<void(std::int64_t g)>& done) {
  const std::size_t e = dtype_size(t);
  for (std::int64_t g = 0; g * per < n; ++g) {
    const std::int64_t len = std::min(per, n - g * per);
    const std::byte* chunk = in + static_cast<std::size_t>(g * per) * e;
    step(
        [&](std::size_t s) {
          for (int j = 0; j < size_; ++j) {
            const Range r = split_range(len, size_, j);
            if (j != index_) {
              put(s, static_cast<std::size_t>(r.start) * e,
                  chunk + static_cast<std::size_t>(r.start) * e,
                  static_cast<std::size_t>(r.size) * e);
            }
          }
        },
        [&](std::size_t s) {
          const Range r = split_range(len, size_, index_);
          const PartStage to = stage(g, r);
          reduce_slots(to.dst, chunk + static_cast<std::size_t>(r.start) * e, s,
                       static_cast<std::size_t>(r.start) * e, static_cast<std::size_t>(r.size), t,
                       op, &to.stage);
        });
    done(g);
  }
}

void ShmGroup::gather_parts(std::byte* out, std::int64_t n, std::int64_t per, std::size_t e,
                            const std::function<void(std::int64_t g)>& ready) {
  const std::int64_t chunks = (n + per - 1) / per;
  // Chunks per step: every device's part of a chunk is at most ceil(per / p) elements.
  const std::int64_t most = (per + size_ - 1) / size_ * static_cast<std::int64_t>(e);
  const std::int64_t batch = std::max<std::int64_t>(1, static_cast<std::int64_t>(kChunk) / most);
  const auto part = [&](std::int64_t g, int j) {
    return split_range(std::min(per, n - g * per), size_, j);
  };
  const auto at = [&](std::int64_t g, const Range& r) {
    return out + static_cast<std::size_t>(g * per + r.start) * e;
  };
  for (std::int64_t g0 = 0; g0 < chunks; g0 += batch) {
    const std::int64_t g1 = std::min(chunks, g0 + batch);
    for (std::int64_t g = g0; g < g1; ++g) ready(g);
    step(
        [&](std::size_t s) {
          std::size_t off = 0;
          for (std::int64_t g = g0; g < g1; ++g) {
            const Range r = part(g, index_);
            put(s, off, at(g, r), static_cast<std::size_t>(r.size) * e);
            off += static_cast<std::size_t>(most);
          }
        },
        [&](std::size_t s) {
          for (int j = 0; j < size_; ++j) {
            if (j == index_) continue;
            std::size_t off = 0;
            for (std::int64_t g = g0; g < g1; ++g) {
              const Range r = part(g, j);
              get(at(g, r), j, s, off, static_cast<std::size_t>(r.size) * e);
              off += static_cast<std::size_t>(most);
            }
          }
        });
  }
}

}  // namespace meshtest::dist::detail
