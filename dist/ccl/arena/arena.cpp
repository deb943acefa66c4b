// arena: the node's shared window, its segments' first-fit allocator and the lookups the
// shared-memory path makes.
#include "dist/ccl/arena/arena.hpp"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <memory>
#include <new>
#include <string_view>

#include "dist/ccl/private_comm.hpp"
#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist {
namespace {

constexpr std::size_t kAlign = 64;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

/// The open arena, owned by an attribute of MPI_COMM_SELF: MPI_Finalize deletes it first,
/// while MPI still works, so the window is freed (collectively) at the job's end.
struct OpenArena {
  std::unique_ptr<NodeArena> arena;
};

OpenArena* open_arena() { return detail::CommAttribute<OpenArena>::find(MPI_COMM_SELF); }

/// Free bytes of /dev/shm, or -1 when it cannot be read (then the window's own failure, if
/// any, is the message).
long long shm_free_bytes() {
  struct statvfs s {};
  if (statvfs("/dev/shm", &s) != 0) return -1;
  return static_cast<long long>(s.f_bavail) * static_cast<long long>(s.f_frsize);
}

/// The default resource of use_for_all_tensors: the open arena while it has room, else the
/// heap. It outlives the arena (tensors keep a pointer to it), so it remembers the segment it
/// allocated from: a tensor freed after close() leaves nothing to free.
class ArenaOrHeap final : public MemoryResource {
 public:
  void* allocate(std::size_t bytes) override {
    if (NodeArena* a = NodeArena::get()) {
      if (void* p = a->try_allocate(bytes)) return p;
    }
    return ::operator new (bytes, std::align_val_t{kAlign});
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    NodeArena* a = NodeArena::get();
    if (a != nullptr && a->offset_of(p, 1).has_value()) return a->deallocate(p, bytes);
    const auto* b = static_cast<const std::byte*>(p);
    if (b >= lo_ && b < hi_) return;  // in an arena closed since
    ::operator delete (p, std::align_val_t{kAlign});
  }
  void remember(const std::byte* lo, std::size_t bytes) {
    lo_ = lo;
    hi_ = lo + bytes;
  }

 private:
  const std::byte* lo_ = nullptr;
  const std::byte* hi_ = nullptr;
};

ArenaOrHeap& arena_or_heap() {
  static auto* r = new ArenaOrHeap;  // never destroyed: tensors may outlive main
  return *r;
}

}  // namespace

void NodeArena::use_for_all_tensors() {
  NodeArena* a = get();
  MESHTEST_CHECK(a != nullptr, "NodeArena::use_for_all_tensors: no arena is open");
  arena_or_heap().remember(a->mine_, a->bytes_);
  set_default_memory_resource(&arena_or_heap());
}

NodeArena& NodeArena::open(std::size_t bytes_per_device) {
  int already = open_arena() != nullptr && open_arena()->arena != nullptr ? 1 : 0;
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, &already, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  MESHTEST_DIST_CHECK(already == 0,
                      "NodeArena::open: an arena is already open on some device "
                      "(one per job; NodeArena::close() frees it)");
  unsigned long long asked = bytes_per_device;
  MESHTEST_MPI(
      MPI_Allreduce(MPI_IN_PLACE, &asked, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD));
  MESHTEST_DIST_CHECK(asked > 0, "NodeArena::open: 0 bytes per device, expected > 0");
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t bytes = round_up(static_cast<std::size_t>(asked), page);
  int rank = 0;
  MESHTEST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_Comm node = MPI_COMM_NULL;
  MESHTEST_MPI(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int local = 0;
  MESHTEST_MPI(MPI_Comm_size(node, &local));
  // A window larger than /dev/shm maps, then dies of SIGBUS on the first page past the end:
  // check first, on every device alike.
  const long long room = shm_free_bytes();
  const long long need = static_cast<long long>(bytes) * local;
  int fits = room < 0 || room >= need ? 1 : 0;
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, &fits, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (fits == 0) {
    MPI_Comm_free(&node);
    fail(
        "NodeArena::open: {} devices x {} bytes do not fit /dev/shm on some node (this one "
        "has {} bytes free); ask for less, or make room in /dev/shm",
        local, bytes, room);
  }
  auto* holder = open_arena();
  if (holder == nullptr)
    holder = detail::CommAttribute<OpenArena>::attach(MPI_COMM_SELF, std::make_unique<OpenArena>());
  holder->arena.reset(new NodeArena(node, bytes));
  return *holder->arena;
}

NodeArena* NodeArena::get() {
  OpenArena* a = open_arena();
  return a != nullptr ? a->arena.get() : nullptr;
}

void NodeArena::close() {
  OpenArena* a = open_arena();
  int open = a != nullptr && a->arena != nullptr ? 1 : 0;
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, &open, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (open == 1) a->arena.reset();
}

NodeArena::NodeArena(MPI_Comm node, std::size_t bytes) : node_(node), bytes_(bytes) {
  MPI_Info info = MPI_INFO_NULL;
  MESHTEST_MPI(MPI_Info_create(&info));
  MESHTEST_MPI(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
  void* mine = nullptr;
  const int rc =
      MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes), 1, info, node_, &mine, &win_);
  MPI_Info_free(&info);
  if (rc != MPI_SUCCESS) {
    std::array<char, MPI_MAX_ERROR_STRING> text{};
    int len = 0;
    MPI_Error_string(rc, text.data(), &len);
    MPI_Comm_free(&node_);
    fail("NodeArena::open: MPI_Win_allocate_shared of {} bytes per device failed: {}", bytes,
         std::string_view(text.data(), static_cast<std::size_t>(len)));
  }
  mine_ = static_cast<std::byte*>(mine);
  int p = 0, world = 0;
  MESHTEST_MPI(MPI_Comm_size(node_, &p));
  MESHTEST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world));
  std::vector<int> worlds(static_cast<std::size_t>(p));
  MESHTEST_MPI(MPI_Allgather(&world, 1, MPI_INT, worlds.data(), 1, MPI_INT, node_));
  for (int j = 0; j < p; ++j) {
    MPI_Aint size = 0;
    int unit = 0;
    void* at = nullptr;
    MESHTEST_MPI(MPI_Win_shared_query(win_, j, &size, &unit, &at));
    base_[worlds[static_cast<std::size_t>(j)]] = static_cast<std::byte*>(at);
  }
  free_[0] = bytes_;
}

NodeArena::~NodeArena() {
  MPI_Win_free(&win_);  // collective over the node: close() and MPI_Finalize run it everywhere
  MPI_Comm_free(&node_);
}

void* NodeArena::try_allocate(std::size_t bytes) {
  const std::size_t n = round_up(std::max<std::size_t>(bytes, 1), kAlign);
  const std::lock_guard<std::mutex> hold(lock_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    const std::size_t at = it->first, rest = it->second - n;
    free_.erase(it);
    if (rest > 0) free_[at + n] = rest;
    used_ += n;
    return mine_ + at;
  }
  return nullptr;
}

void* NodeArena::allocate(std::size_t bytes) {
  if (void* p = try_allocate(bytes)) return p;
  const std::lock_guard<std::mutex> hold(lock_);
  std::size_t largest = 0;
  for (const auto& [at, size] : free_) largest = std::max(largest, size);
  fail("node arena: no room for {} bytes ({} of {} free, largest hole {}); open it larger", bytes,
       bytes_ - used_, bytes_, largest);
}

void NodeArena::deallocate(void* p, std::size_t bytes) noexcept {
  const std::size_t n = round_up(std::max<std::size_t>(bytes, 1), kAlign);
  const auto at = static_cast<std::size_t>(static_cast<std::byte*>(p) - mine_);
  const std::lock_guard<std::mutex> hold(lock_);
  used_ -= n;
  auto next = free_.lower_bound(at);
  std::size_t start = at, size = n;
  if (next != free_.begin()) {  // merge with the hole before
    auto prev = std::prev(next);
    if (prev->first + prev->second == at) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == at + n) {  // and the one after
    size += next->second;
    free_.erase(next);
  }
  free_[start] = size;
}

std::optional<std::uint64_t> NodeArena::offset_of(const void* p, std::size_t len) const {
  const auto* b = static_cast<const std::byte*>(p);
  if (b < mine_ || b + len > mine_ + bytes_ || b == nullptr) return std::nullopt;
  return static_cast<std::uint64_t>(b - mine_);
}

std::optional<std::uint64_t> NodeArena::offset_in_open(const void* p, std::size_t len) {
  const NodeArena* a = get();
  return a != nullptr ? a->offset_of(p, len) : std::nullopt;
}

std::byte* NodeArena::at(int world_rank, std::uint64_t offset) const {
  const auto it = base_.find(world_rank);
  return it == base_.end() ? nullptr : it->second + offset;
}

std::size_t NodeArena::in_use() const {
  const std::lock_guard<std::mutex> hold(lock_);
  return used_;
}

}  // namespace meshtest::dist
