// shm_window: the shared window of a node communicator — which communicators get one, the
// segments and the step size the devices agree on — and the agreement step.
#include "dist/ccl/paths/shm/shm_window.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <thread>

#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist::detail {
namespace {

std::optional<bool>& enabled_override() {
  static std::optional<bool> on;
  return on;
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
  if (*end != 0 || n < 4096 || n > static_cast<long long>(ShmWindow::kChunk)) {
    dist::fail("MESHTEST_CCL_SHM_CHUNK is '{}'; expected a byte count from 4096 to {}", v,
               ShmWindow::kChunk);
  }
  return n / static_cast<long long>(ShmWindow::kLine) * static_cast<long long>(ShmWindow::kLine);
}

}  // namespace

bool ShmWindow::enabled() {
  if (enabled_override()) return *enabled_override();
  const char* v = std::getenv("MESHTEST_CCL_SHM");
  return v == nullptr || std::string_view(v) != "0";
}

void ShmWindow::set_enabled(bool on) { enabled_override() = on; }

void ShmWindow::set_node_size_for_testing(int q) { test_node_size() = q; }

MPI_Comm ShmWindow::split_node(MPI_Comm comm, int key) {
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

bool ShmWindow::one_node(MPI_Comm comm) {
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

MPI_Comm ShmWindow::shared_node(MPI_Comm comm) {
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
    if (ok == 1) return node;
    MESHTEST_MPI(MPI_Comm_free(&node));
  }
  return MPI_COMM_NULL;
}

ShmWindow::ShmWindow(MPI_Comm node) : node_(node) {
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
  std::array<long long, 2> agreed{node_oversubscribed() ? 1 : 0, requested_chunk()};
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, agreed.data(), 2, MPI_LONG_LONG, MPI_MAX, node_));
  yield_ = agreed[0] != 0;
  // Whole slots when yielding or when many devices share each step (at p >= 8 a quarter slot
  // leaves each block 8 KiB or less per step, and lock-stepping p devices per step costs more
  // than the cache it saves: bench ccl at np 8 and 16, docs/ccl-bench.md).
  const bool whole = yield_ || size_ >= kManyDevices;
  chunk_ = agreed[1] > 0 ? static_cast<std::size_t>(agreed[1]) : whole ? kChunk : kChunk / 4;
  handles_.assign(static_cast<std::size_t>(size_), kNoHandle);
  out_handles_ = handles_;
  MESHTEST_MPI(MPI_Barrier(node_));  // every counter is zero before anyone steps
}

ShmWindow::~ShmWindow() {
  MPI_Win_free(&win_);  // collective: the communicator this window belongs to is being freed
  MPI_Comm_free(&node_);
}

bool ShmWindow::agree(std::uint64_t hash, bool error, std::uint64_t in, std::uint64_t out) {
  bool same = true;
  step(
      [&](std::size_t s) {
        const std::uint64_t v[4] = {hash, error ? 1U : 0U, in, out};
        std::memcpy(header(index_, s), v, sizeof v);
      },
      [&](std::size_t s) {
        for (int j = 0; j < size_; ++j) {
          std::uint64_t v[4];
          std::memcpy(v, header(j, s), sizeof v);
          same = same && v[0] == hash && v[1] == 0;
          handles_[static_cast<std::size_t>(j)] = v[2];
          out_handles_[static_cast<std::size_t>(j)] = v[3];
        }
      });
  return same;
}

}  // namespace meshtest::dist::detail
