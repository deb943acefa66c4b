// shm_window: the MPI-3 shared window under the intra-node collectives of shm.hpp — which
// communicators get one, its segment layout, and the step protocol every collective runs on it.
#pragma once

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "dist/ccl/copy.hpp"

namespace meshtest::dist::detail {

/// A communicator's devices, all on one node, exchanging through one MPI-3 shared window
/// (MPI_Win_allocate_shared): each device owns a segment of kSlots slots of kChunk bytes and
/// two step counters. A collective is a sequence of steps; in step g every device waits until
/// slot g % kSlots is free (every device has consumed step g - kSlots), writes its part into
/// its own slot, publishes `ready = g + 1` (release), waits until every device is ready
/// (acquire) and reads what it needs from every device's slot, then publishes `done = g + 1`.
/// No MPI call is made per step.
///
/// The agreement of a call (Call::agree) is itself a step: every device writes its signature
/// hash and error flag, and every device reads all of them, so all decide alike whether the
/// group agrees (on a mismatch Call falls back to the full MPI metadata exchange and its
/// detailed error). Every device runs the same steps for the same agreed call, so the step
/// counters never diverge.
///
/// Waiting spins (x86 pause) and then yields; when the node holds more ranks than cores
/// (mpirun --oversubscribe) it yields at once and steps move whole slots (fewer steps, fewer
/// context switches); otherwise steps move a quarter slot (measured best on 2 ranks). A wait
/// longer than kSleepAfter (a peer that lags: stalled, failed, or not scheduled on a busy
/// machine) sleeps between looks, from 20 us doubling to 0.5 ms, and leaves the cores to the
/// processes that have work. A device that never arrives leaves the others waiting inside the
/// collective, where the test harness's watchdog sees them, as it sees a rank waiting inside an
/// MPI collective.
///
/// The collectives over the window are ShmGroup's (shm.hpp); a ShmWindow is made only as one.
class ShmWindow {
 public:
  static constexpr std::size_t kSlots = 4;
  /// A wait sleeps between looks once it has lasted this long (see the class comment): far
  /// above a step's time on an idle node (tens of microseconds), so the benches never sleep.
  static constexpr std::chrono::milliseconds kSleepAfter{2};
  /// From this many devices on, steps move whole slots (see chunk()), and all_to_all leaves
  /// blocks of ShmGroup::kSingleCopyBlock bytes or more to MPI (ShmGroup::window_all_to_all).
  static constexpr int kManyDevices = 8;
  static constexpr std::size_t kChunk = std::size_t{512} << 10;  ///< bytes per slot
  /// Bytes of a cache line: the counters and headers each have their own, and all_to_all
  /// places each device's piece of a step at a multiple of it.
  static constexpr std::size_t kLine = 64;
  /// Bytes a step moves per device: a quarter slot, so the ring stays in cache, unless the
  /// node is oversubscribed, where each step costs context switches, or the group has
  /// kManyDevices or more: then a whole slot.
  /// MESHTEST_CCL_SHM_CHUNK (bytes, 4096 to kChunk) overrides it for tuning; the devices take
  /// the largest value any of them asks for. all_reduce uses at most half a slot (the other
  /// half holds the reduced part).
  std::size_t chunk() const { return chunk_; }

  /// What this device has moved through the window since the group was made: steps (the
  /// agreement steps included), bytes written for other devices (into its own slots, or
  /// straight into their outputs in the node arena) and bytes read from other devices (their
  /// slots, or their inputs in the arena). The bench divides the difference over a run by its
  /// calls.
  struct Traffic {
    std::uint64_t steps = 0, written = 0, read = 0;
  };
  Traffic traffic() const { return {steps_, written_, read_}; }

  /// Collective over `comm`: whether all its devices share one node (MPI_COMM_TYPE_SHARED:
  /// Open MPI's node, one host). A group that spans nodes has no shared-memory group; its
  /// CCLs take the MPI path.
  static bool one_node(MPI_Comm comm);
  /// Collective over `comm`: the devices of comm on this device's node, ordered by `key`
  /// (MPI_Comm_split_type MPI_COMM_TYPE_SHARED: Open MPI's node, one host). For tests and
  /// benches on one machine, a node size q > 0 (set_node_size_for_testing, or the environment
  /// variable MESHTEST_CCL_TEST_NODE_SIZE) makes every q consecutive ranks of comm a node
  /// instead; then neither one_node() nor ShmGroup::establish() sees one node, and the node
  /// chain of node_chain.hpp runs, all through shared memory.
  static MPI_Comm split_node(MPI_Comm comm, int key);
  static void set_node_size_for_testing(int q);
  /// Whether this process makes groups for communicators established from now on: the
  /// environment variable MESHTEST_CCL_SHM (0 turns the path off; default on), unless
  /// set_enabled() overrode it. Devices that disagree get no group (agreed at establish).
  static bool enabled();
  static void set_enabled(bool on);

  ShmWindow(const ShmWindow&) = delete;
  ShmWindow& operator=(const ShmWindow&) = delete;
  /// Collective over the node communicator: frees the window and the communicator.
  ~ShmWindow();

  int size() const { return size_; }
  int index() const { return index_; }

  /// Not in the node arena (agree()'s handles).
  static constexpr std::uint64_t kNoHandle = ~std::uint64_t{0};
  /// One step: true when every device passed the same hash and no device an error. Each
  /// device also passes its input's and its output's offsets in its segment of the node arena
  /// (arena.hpp), or kNoHandle, and every device keeps every device's (handles(),
  /// out_handles()) until the next agreement.
  bool agree(std::uint64_t hash, bool error, std::uint64_t in = kNoHandle,
             std::uint64_t out = kNoHandle);
  /// Every device's input handle of the last agreement (kNoHandle for all before the first).
  const std::vector<std::uint64_t>& handles() const { return handles_; }
  /// Every device's output handle of the last agreement (kNoHandle: not given, or not in the
  /// arena).
  const std::vector<std::uint64_t>& out_handles() const { return out_handles_; }

 protected:
  /// Collective over `comm`: comm's devices (in comm's order) as a node communicator for a
  /// window, when comm has more than one device, all of them share a node, every device has
  /// the path enabled (enabled()) and a chunk holds a kLine piece per device; MPI_COMM_NULL
  /// otherwise, on every device alike.
  static MPI_Comm shared_node(MPI_Comm comm);
  /// Collective over `node` (which it owns from now on): allocates every device's segment and
  /// agrees on the step size (chunk()). Throws Error when the window cannot be allocated.
  explicit ShmWindow(MPI_Comm node);

  /// One step of the protocol (see the class comment): write(s) fills this device's slot s,
  /// read(s) reads the slots s of every device.
  template <class Write, class Read>
  void step(const Write& write, const Read& read);
  /// Copies into this device's slot s at `at`, counted as written.
  void put(std::size_t s, std::size_t at, const std::byte* from, std::size_t len);
  /// Copies from device j's slot s at `at`, counted as read unless j is this device.
  void get(std::byte* to, int j, std::size_t s, std::size_t at, std::size_t len);
  std::byte* slot(int device, std::size_t slot) const;
  /// Waits until every device has completed this device's last step (its read included): after
  /// it, no device reads what this device's step exposed (its slots, or its input in place).
  void finish() const { wait_all(kDone, steps_); }

  int size_ = 1;
  int index_ = 0;
  std::size_t chunk_ = kChunk;
  std::uint64_t written_ = 0, read_ = 0;
  std::vector<std::uint64_t> handles_, out_handles_;  // every device's, from the last agree()

 private:
  // A device's segment: the two step counters on their own cache lines, one kLine header per
  // slot (the agreement step's hash and error flag), then the slots, page aligned.
  static constexpr std::size_t kReady = 0, kDone = 1;
  static constexpr std::size_t kHeaders = 2 * kLine;
  static constexpr std::size_t kData = 4096;
  static_assert(kHeaders + kSlots * kLine <= kData);
  static constexpr std::size_t kSegment = kData + kSlots * kChunk;

  void wait_all(std::size_t counter, std::uint64_t target) const;
  std::atomic<std::uint64_t>& counter(int device, std::size_t which) const;
  std::byte* header(int device, std::size_t slot) const;

  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  bool yield_ = false;
  std::vector<std::byte*> base_;  // every device's segment
  std::uint64_t steps_ = 0;       // steps this device has begun
};

// The step protocol, inline: every collective runs it once per step.

inline std::atomic<std::uint64_t>& ShmWindow::counter(int device, std::size_t which) const {
  return *std::launder(reinterpret_cast<std::atomic<std::uint64_t>*>(
      base_[static_cast<std::size_t>(device)] + which * kLine));
}

inline std::byte* ShmWindow::header(int device, std::size_t s) const {
  return base_[static_cast<std::size_t>(device)] + kHeaders + s * kLine;
}

inline std::byte* ShmWindow::slot(int device, std::size_t s) const {
  return base_[static_cast<std::size_t>(device)] + kData + s * kChunk;
}

inline void ShmWindow::wait_all(std::size_t which, std::uint64_t target) const {
  int spins = 0;
  long yields = 0;
  bool sleeping = false;
  std::chrono::steady_clock::time_point since;
  std::chrono::microseconds nap{20};
  for (int j = 0; j < size_; ++j) {
    const std::atomic<std::uint64_t>& c = counter(j, which);
    while (c.load(std::memory_order_acquire) < target) {
      if (!yield_ && spins < 4096) {
        ++spins;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else if (sleeping) {
        std::this_thread::sleep_for(nap);
        nap = std::min(2 * nap, std::chrono::microseconds(500));
      } else {
        // The clock is read once per 64 yields (a yield costs a microsecond or more).
        if (yields++ % 64 == 0) {
          const auto now = std::chrono::steady_clock::now();
          if (yields == 1) since = now;
          sleeping = now - since >= kSleepAfter;
        }
        sched_yield();
      }
    }
  }
}

template <class Write, class Read>
void ShmWindow::step(const Write& write, const Read& read) {
  const std::uint64_t g = steps_++;
  const std::size_t s = g % kSlots;
  if (g >= kSlots) wait_all(kDone, g - kSlots + 1);  // every device has read step g - kSlots
  write(s);
  counter(index_, kReady).store(g + 1, std::memory_order_release);
  wait_all(kReady, g + 1);
  read(s);
  counter(index_, kDone).store(g + 1, std::memory_order_release);
}

inline void ShmWindow::put(std::size_t s, std::size_t at, const std::byte* from, std::size_t len) {
  copy_bytes(slot(index_, s) + at, from, len);
  written_ += len;
}

inline void ShmWindow::get(std::byte* to, int j, std::size_t s, std::size_t at, std::size_t len) {
  copy_bytes(to, slot(j, s) + at, len);
  if (j != index_) read_ += len;
}

}  // namespace meshtest::dist::detail
