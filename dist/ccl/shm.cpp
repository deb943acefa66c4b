// shm: collectives through an MPI-3 shared window, streamed in chunks through a slot ring.
#include "dist/ccl/shm.hpp"

#include <sched.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string_view>
#include <thread>

#include "dist/ccl/private_comm.hpp"
#include "dist/ccl/reduce.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/core/shape.hpp"

namespace meshtest::dist::detail {
namespace {

// A device's segment: the two step counters on their own cache lines, one 64-byte header per
// slot (the agreement step's hash and error flag), then the slots, page aligned.
constexpr std::size_t kLine = 64;
constexpr std::size_t kReady = 0, kDone = 1;
constexpr std::size_t kHeaders = 2 * kLine;
constexpr std::size_t kData = 4096;
static_assert(kHeaders + ShmGroup::kSlots * kLine <= kData);
constexpr std::size_t kSegment = kData + ShmGroup::kSlots * ShmGroup::kChunk;

std::optional<bool>& enabled_override() {
  static std::optional<bool> on;
  return on;
}

/// Attribute of a communicator: present once establish() ran for it; holds the group or null
/// (~ShmGroup frees the window, collectively, as the communicator is freed).
struct EstablishedWindow {
  std::unique_ptr<ShmGroup> group;
};

EstablishedWindow* established(MPI_Comm comm) {
  return CommAttribute<EstablishedWindow>::find(comm);
}

std::optional<int>& test_node_size() {
  static std::optional<int> q;
  return q;
}

// MESHTEST_CCL_TEST_NODE_SIZE, or 0 when unset.
int env_node_size() {
  const char* v = std::getenv("MESHTEST_CCL_TEST_NODE_SIZE");
  if (v == nullptr || *v == 0) return 0;
  char* end = nullptr;
  const long q = std::strtol(v, &end, 10);
  if (*end != 0 || q < 1 || q > (1 << 20)) {
    dist::fail("MESHTEST_CCL_TEST_NODE_SIZE is '{}'; expected a positive rank count", v);
  }
  return static_cast<int>(q);
}

// More ranks on this node than cores: waiting should yield the core at once.
bool node_oversubscribed() {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
  return local != nullptr && std::atoi(local) > static_cast<int>(cores);
}

// MESHTEST_CCL_SHM_CHUNK in bytes (rounded down to 64), or 0 when unset.
long long requested_chunk() {
  const char* v = std::getenv("MESHTEST_CCL_SHM_CHUNK");
  if (v == nullptr || *v == 0) return 0;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end != 0 || n < 4096 || n > static_cast<long long>(ShmGroup::kChunk)) {
    dist::fail("MESHTEST_CCL_SHM_CHUNK is '{}'; expected a byte count from 4096 to {}", v,
               ShmGroup::kChunk);
  }
  return n / static_cast<long long>(kLine) * static_cast<long long>(kLine);
}

}  // namespace

bool ShmGroup::enabled() {
  if (enabled_override()) return *enabled_override();
  const char* v = std::getenv("MESHTEST_CCL_SHM");
  return v == nullptr || std::string_view(v) != "0";
}

void ShmGroup::set_enabled(bool on) { enabled_override() = on; }

ShmGroup* ShmGroup::find(MPI_Comm comm) {
  EstablishedWindow* e = established(comm);
  return e != nullptr ? e->group.get() : nullptr;
}

void ShmGroup::set_node_size_for_testing(int q) { test_node_size() = q; }

MPI_Comm ShmGroup::split_node(MPI_Comm comm, int key) {
  MPI_Comm node = MPI_COMM_NULL;
  const int q = test_node_size().value_or(env_node_size());
  if (q > 0) {
    int rank = 0;
    MESHTEST_MPI(MPI_Comm_rank(comm, &rank));
    MESHTEST_MPI(MPI_Comm_split(comm, rank / q, key, &node));
  } else {
    MESHTEST_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, &node));
  }
  return node;
}

bool ShmGroup::one_node(MPI_Comm comm) {
  int p = 0;
  MESHTEST_MPI(MPI_Comm_size(comm, &p));
  MPI_Comm node = split_node(comm, 0);
  int local = 0;
  MESHTEST_MPI(MPI_Comm_size(node, &local));
  MESHTEST_MPI(MPI_Comm_free(&node));
  int all = local == p ? 1 : 0;
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm));
  return all == 1;
}

void ShmGroup::establish(MPI_Comm comm) {
  if (established(comm) != nullptr) return;
  auto e = std::make_unique<EstablishedWindow>();
  int p = 0;
  MESHTEST_MPI(MPI_Comm_size(comm, &p));
  if (p > 1) {
    int rank = 0;
    MESHTEST_MPI(MPI_Comm_rank(comm, &rank));
    MPI_Comm node = split_node(comm, rank);  // ranks in comm's order (key = rank)
    int local = 0;
    MESHTEST_MPI(MPI_Comm_size(node, &local));
    // Every device must be able and willing; all_to_all needs a 64-byte piece per device of
    // a chunk (the chunk is agreed as the largest asked for, so this device's is a bound).
    const long long chunk = requested_chunk() > 0 ? requested_chunk() : kChunk / 4;
    int ok = local == p && p <= chunk / static_cast<long long>(kLine) && enabled() ? 1 : 0;
    MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm));
    if (ok == 1) {
      e->group.reset(new ShmGroup(node, node_oversubscribed()));
    } else {
      MESHTEST_MPI(MPI_Comm_free(&node));
    }
  }
  CommAttribute<EstablishedWindow>::attach(comm, std::move(e));
}

ShmGroup::ShmGroup(MPI_Comm node, bool oversubscribed) : node_(node) {
  MESHTEST_MPI(MPI_Comm_size(node_, &size_));
  MESHTEST_MPI(MPI_Comm_rank(node_, &index_));
  // Every device's segment wherever the OS likes it (its own pages, not one contiguous block).
  MPI_Info info = MPI_INFO_NULL;
  MESHTEST_MPI(MPI_Info_create(&info));
  MESHTEST_MPI(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
  void* mine = nullptr;
  const int rc =
      MPI_Win_allocate_shared(static_cast<MPI_Aint>(kSegment), 1, info, node_, &mine, &win_);
  MPI_Info_free(&info);
  if (rc != MPI_SUCCESS) {  // e.g. a small /dev/shm (containers default to 64 MiB)
    std::array<char, MPI_MAX_ERROR_STRING> text{};
    int len = 0;
    MPI_Error_string(rc, text.data(), &len);
    MPI_Comm_free(&node_);
    dist::fail(
        "shared-memory CCL path: MPI_Win_allocate_shared of {} bytes per device failed: {}; "
        "make room in /dev/shm or set MESHTEST_CCL_SHM=0 to use the MPI path",
        kSegment, std::string_view(text.data(), static_cast<std::size_t>(len)));
  }
  // Every device's view of every segment (the addresses differ per process).
  base_.resize(static_cast<std::size_t>(size_));
  for (int j = 0; j < size_; ++j) {
    MPI_Aint bytes = 0;
    int unit = 0;
    void* at = nullptr;
    MESHTEST_MPI(MPI_Win_shared_query(win_, j, &bytes, &unit, &at));
    base_[static_cast<std::size_t>(j)] = static_cast<std::byte*>(at);
  }
  for (std::size_t c : {kReady, kDone})
    new (base_[static_cast<std::size_t>(index_)] + c * kLine) std::atomic<std::uint64_t>(0);
  // The chunk size sets every call's step count, so it must be the same on every device: one
  // device that must yield makes every device yield (and use whole slots).
  std::array<long long, 2> agreed{oversubscribed ? 1 : 0, requested_chunk()};
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, agreed.data(), 2, MPI_LONG_LONG, MPI_MAX, node_));
  yield_ = agreed[0] != 0;
  // Whole slots when yielding or when many devices share each step (at p >= 8 a quarter slot
  // leaves each block 8 KiB or less per step, and lock-stepping p devices per step costs more
  // than the cache it saves: bench ccl at np 8 and 16, docs/ccl-bench.md).
  const bool whole = yield_ || size_ >= kManyDevices;
  chunk_ = agreed[1] > 0 ? static_cast<std::size_t>(agreed[1]) : whole ? kChunk : kChunk / 4;
  terms_.resize(static_cast<std::size_t>(size_));
  MESHTEST_MPI(MPI_Barrier(node_));  // every counter is zero before anyone steps
}

ShmGroup::~ShmGroup() {
  MPI_Win_free(&win_);  // collective: the communicator this group belongs to is being freed
  MPI_Comm_free(&node_);
}

std::atomic<std::uint64_t>& ShmGroup::counter(int device, std::size_t which) const {
  return *std::launder(reinterpret_cast<std::atomic<std::uint64_t>*>(
      base_[static_cast<std::size_t>(device)] + which * kLine));
}

std::byte* ShmGroup::header(int device, std::size_t s) const {
  return base_[static_cast<std::size_t>(device)] + kHeaders + s * kLine;
}

std::byte* ShmGroup::slot(int device, std::size_t s) const {
  return base_[static_cast<std::size_t>(device)] + kData + s * kChunk;
}

void ShmGroup::wait_all(std::size_t which, std::uint64_t target) const {
  for (int j = 0; j < size_; ++j) {
    const std::atomic<std::uint64_t>& c = counter(j, which);
    int spins = 0;
    while (c.load(std::memory_order_acquire) < target) {
      if (!yield_ && ++spins < 4096) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        sched_yield();
      }
    }
  }
}

template <class Write, class Read>
void ShmGroup::step(const Write& write, const Read& read) {
  const std::uint64_t g = steps_++;
  const std::size_t s = g % kSlots;
  if (g >= kSlots) wait_all(kDone, g - kSlots + 1);  // every device has read step g - kSlots
  write(s);
  counter(index_, kReady).store(g + 1, std::memory_order_release);
  wait_all(kReady, g + 1);
  read(s);
  counter(index_, kDone).store(g + 1, std::memory_order_release);
}

bool ShmGroup::agree(std::uint64_t hash, bool error) {
  bool same = true;
  step(
      [&](std::size_t s) {
        const std::uint64_t v[2] = {hash, error ? 1U : 0U};
        std::memcpy(header(index_, s), v, sizeof v);
      },
      [&](std::size_t s) {
        for (int j = 0; j < size_; ++j) {
          std::uint64_t v[2];
          std::memcpy(v, header(j, s), sizeof v);
          same = same && v[0] == hash && v[1] == 0;
        }
      });
  return same;
}

void ShmGroup::put(std::size_t s, std::size_t at, const std::byte* from, std::size_t len) {
  std::memcpy(slot(index_, s) + at, from, len);
  written_ += len;
}

void ShmGroup::get(std::byte* to, int j, std::size_t s, std::size_t at, std::size_t len) {
  std::memcpy(to, slot(j, s) + at, len);
  if (j != index_) read_ += len;
}

void ShmGroup::all_reduce(const std::byte* in, std::byte* out, std::int64_t n, DType t,
                          ReduceOp op) {
  // Chunk g (elements [g*per, g*per + len)) is split by the array_split rule; device j reduces
  // part j. Step g writes the other parts of chunk g into the slot's first half and the
  // reduced part of chunk g-1 into its second half, then reduces part `index` of chunk g and
  // gathers the reduced parts of chunk g-1: chunks + 1 steps.
  const std::size_t e = dtype_size(t);
  const std::size_t half = kChunk / 2;
  const auto per = static_cast<std::int64_t>(std::min(chunk_, half) / e);
  const std::int64_t chunks = (n + per - 1) / per;
  const auto part = [&](std::int64_t g, int j) {  // part j of chunk g, offset in the chunk
    return split_range(std::min(per, n - g * per), size_, j);
  };
  const auto at = [&](std::int64_t g, const Range& r) {
    return static_cast<std::size_t>(g * per + r.start) * e;
  };
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
