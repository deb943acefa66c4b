// shm: collectives through an MPI-3 shared window, streamed in chunks through a slot ring.
#include "dist/ccl/shm.hpp"

#include <sched.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string_view>
#include <thread>
#include <type_traits>

#include "dist/mesh/mpi_check.hpp"

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

// ---- reductions: dst = a op b (dst may be a or b) -------------------------------------------

template <class T, class F>
void combine(std::byte* dst, const std::byte* a, const std::byte* b, std::size_t n, F f) {
  using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
  const auto len = static_cast<Eigen::Index>(n);
  Eigen::Map<Array> d(reinterpret_cast<T*>(dst), len);
  const Eigen::Map<const Array> x(reinterpret_cast<const T*>(a), len);
  const Eigen::Map<const Array> y(reinterpret_cast<const T*>(b), len);
  if constexpr (std::is_same_v<T, bf16>) {  // each op in f32, rounded (as the MPI bf16 op)
    d = f(x.template cast<float>(), y.template cast<float>()).template cast<bf16>();
  } else {
    d = f(x, y);
  }
}

template <class T>
void combine_op(std::byte* dst, const std::byte* a, const std::byte* b, std::size_t n,
                ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      if constexpr (std::is_integral_v<T>) {  // wraps, as MPI's integer sum does
        using U = std::make_unsigned_t<T>;
        combine<U>(dst, a, b, n, [](const auto& x, const auto& y) { return x + y; });
      } else {
        combine<T>(dst, a, b, n, [](const auto& x, const auto& y) { return x + y; });
      }
      return;
    case ReduceOp::max:
      combine<T>(dst, a, b, n, [](const auto& x, const auto& y) { return x.max(y); });
      return;
    case ReduceOp::min:
      combine<T>(dst, a, b, n, [](const auto& x, const auto& y) { return x.min(y); });
      return;
  }
}

void combine(std::byte* dst, const std::byte* a, const std::byte* b, std::size_t n, DType t,
             ReduceOp op) {
  switch (t) {
    case DType::f32:
      return combine_op<float>(dst, a, b, n, op);
    case DType::f64:
      return combine_op<double>(dst, a, b, n, op);
    case DType::bf16:
      return combine_op<bf16>(dst, a, b, n, op);
    case DType::i32:
      return combine_op<std::int32_t>(dst, a, b, n, op);
    case DType::i64:
      return combine_op<std::int64_t>(dst, a, b, n, op);
    case DType::u8:
      break;
  }
  dist::fail("shared-memory reduction: dtype {} cannot be reduced", t);
}

/// Attribute of a communicator: present once establish() ran for it; holds the group or null.
struct Established {
  std::unique_ptr<ShmGroup> group;
};

int free_established(MPI_Comm, int, void* attr, void*) {
  delete static_cast<Established*>(attr);  // ~ShmGroup frees the window (collective)
  return MPI_SUCCESS;
}

int keyval() {
  static const int key = [] {
    int k = MPI_KEYVAL_INVALID;
    MESHTEST_MPI(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_established, &k, nullptr));
    return k;
  }();
  return key;
}

Established* established(MPI_Comm comm) {
  void* attr = nullptr;
  int found = 0;
  MESHTEST_MPI(MPI_Comm_get_attr(comm, keyval(), &attr, &found));
  return found != 0 ? static_cast<Established*>(attr) : nullptr;
}

// More ranks on this node than cores: waiting should yield the core at once.
bool node_oversubscribed() {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
  return local != nullptr && std::atoi(local) > static_cast<int>(cores);
}

}  // namespace

bool ShmGroup::enabled() {
  if (enabled_override()) return *enabled_override();
  const char* v = std::getenv("MESHTEST_CCL_SHM");
  return v == nullptr || std::string_view(v) != "0";
}

void ShmGroup::set_enabled(bool on) { enabled_override() = on; }

ShmGroup* ShmGroup::find(MPI_Comm comm) {
  Established* e = established(comm);
  return e != nullptr ? e->group.get() : nullptr;
}

void ShmGroup::establish(MPI_Comm comm) {
  if (established(comm) != nullptr) return;
  auto e = std::make_unique<Established>();
  int p = 0;
  MESHTEST_MPI(MPI_Comm_size(comm, &p));
  if (p > 1) {
    int rank = 0;
    MESHTEST_MPI(MPI_Comm_rank(comm, &rank));
    MPI_Comm node = MPI_COMM_NULL;  // ranks in comm's order (key = rank)
    MESHTEST_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    int local = 0;
    MESHTEST_MPI(MPI_Comm_size(node, &local));
    // Every device must be able and willing; all_to_all needs a 64-byte piece per device.
    int ok = local == p && p <= static_cast<int>(kChunk / 4 / kLine) && enabled() ? 1 : 0;
    MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm));
    if (ok == 1) {
      e->group.reset(new ShmGroup(node, node_oversubscribed()));
    } else {
      MESHTEST_MPI(MPI_Comm_free(&node));
    }
  }
  MESHTEST_MPI(MPI_Comm_set_attr(comm, keyval(), e.get()));
  e.release();  // owned by the attribute from now on
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
  int over = oversubscribed ? 1 : 0;
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, &over, 1, MPI_INT, MPI_MAX, node_));
  yield_ = over != 0;
  chunk_ = yield_ ? kChunk : kChunk / 4;
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

void ShmGroup::all_reduce(const std::byte* in, std::byte* out, std::int64_t n, DType t,
                          ReduceOp op) {
  const std::size_t e = dtype_size(t);
  const std::size_t bytes = static_cast<std::size_t>(n) * e;
  for (std::size_t off = 0; off < bytes; off += chunk_) {
    const std::size_t len = std::min(chunk_, bytes - off);
    step([&](std::size_t s) { std::memcpy(slot(index_, s), in + off, len); },
         [&](std::size_t s) { reduce_slots(out + off, s, 0, len / e, t, op); });
  }
}

void ShmGroup::all_gather(const std::byte* in, std::byte* out, std::size_t piece) {
  for (std::size_t off = 0; off < piece; off += chunk_) {
    const std::size_t len = std::min(chunk_, piece - off);
    step([&](std::size_t s) { std::memcpy(slot(index_, s), in + off, len); },
         [&](std::size_t s) {
           for (int j = 0; j < size_; ++j) {
             std::memcpy(out + static_cast<std::size_t>(j) * piece + off, slot(j, s), len);
           }
         });
  }
}

template <class Read>
void ShmGroup::exchange_blocks(const std::byte* in, std::size_t block, const Read& read) {
  const auto p = static_cast<std::size_t>(size_);
  const std::size_t sub = chunk_ / p / kLine * kLine;  // bytes of each block per step
  for (std::size_t off = 0; off < block; off += sub) {
    const std::size_t len = std::min(sub, block - off);
    step(
        [&](std::size_t s) {
          for (std::size_t j = 0; j < p; ++j) {
            std::memcpy(slot(index_, s) + j * sub, in + j * block + off, len);
          }
        },
        [&](std::size_t s) { read(s, off, len, static_cast<std::size_t>(index_) * sub); });
  }
}

void ShmGroup::reduce_slots(std::byte* dst, std::size_t s, std::size_t at, std::size_t n, DType t,
                            ReduceOp op) const {
  combine(dst, slot(0, s) + at, slot(1, s) + at, n, t, op);
  for (int j = 2; j < size_; ++j) combine(dst, dst, slot(j, s) + at, n, t, op);
}

void ShmGroup::all_to_all(const std::byte* in, std::byte* out, std::size_t block) {
  exchange_blocks(in, block, [&](std::size_t s, std::size_t off, std::size_t len, std::size_t at) {
    for (int j = 0; j < size_; ++j) {
      std::memcpy(out + static_cast<std::size_t>(j) * block + off, slot(j, s) + at, len);
    }
  });
}

void ShmGroup::reduce_scatter(const std::byte* in, std::byte* out, std::int64_t n, DType t,
                              ReduceOp op) {
  const std::size_t e = dtype_size(t);
  exchange_blocks(in, static_cast<std::size_t>(n) * e,
                  [&](std::size_t s, std::size_t off, std::size_t len, std::size_t at) {
                    reduce_slots(out + off, s, at, len / e, t, op);
                  });
}

}  // namespace meshtest::dist::detail
