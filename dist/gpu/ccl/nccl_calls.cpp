// nccl_calls: the NCCL lock, the live communicators, polling waits and the abort hook.
#include "dist/gpu/ccl/nccl_calls.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/mesh/environment.hpp"
#include "dist/mesh/job_end.hpp"
#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist::gpu {
namespace {

using Clock = std::chrono::steady_clock;

struct State {
  std::timed_mutex calls;        // held around every short sequence of NCCL calls
  std::vector<ncclComm_t> live;  // in order of creation; guarded by `calls`
  std::atomic<bool> aborted{false};
  std::mutex reason_mutex;
  std::string reason;          // guarded by reason_mutex
  bool finalize_hook = false;  // guarded by `calls`
  bool process_hooks = false;  // guarded by `calls`
};

/// Never destroyed: the abort hook may run while the process exits.
State& state() {
  static State* s = new State;
  return *s;
}

/// Paces a polling loop: yields for the first 200 us (a collective that is about to finish),
/// then sleeps in steps growing by 20 us up to 1 ms.
class Pace {
 public:
  void pause() {
    if (Clock::now() - start_ < std::chrono::microseconds(200)) {
      std::this_thread::yield();
      return;
    }
    n_ = std::min(n_ + 1, 50);
    std::this_thread::sleep_for(std::chrono::microseconds(20 * n_));
  }

 private:
  Clock::time_point start_ = Clock::now();
  int n_ = 0;
};

/// Polls comm's asynchronous state until it leaves ncclInProgress and returns it (or the failed
/// query's result); nullopt when `deadline` passes first. Throws once aborted (NcclLock).
std::optional<ncclResult_t> poll_state(ncclComm_t comm, std::string_view what,
                                       std::optional<Clock::time_point> deadline = {}) {
  Pace pace;
  for (;;) {
    ncclResult_t st = ncclInProgress;
    {
      NcclLock lock(what);
      const ncclResult_t rc = ncclCommGetAsyncError(comm, &st);
      if (rc != ncclSuccess) return rc;
    }
    if (st != ncclInProgress) return st;
    if (deadline && Clock::now() >= *deadline) return std::nullopt;
    pace.pause();
  }
}

bool erase_live(ncclComm_t comm) {
  auto& live = state().live;
  const auto it = std::find(live.begin(), live.end(), comm);
  if (it == live.end()) return false;
  live.erase(it);
  return true;
}

/// MPI_Finalize deletes MPI_COMM_SELF's attributes first: the communicators still live are
/// released there, while MPI and CUDA are both still up.
int release_at_finalize(MPI_Comm, int, void*, void*) {
  std::vector<ncclComm_t> live;
  {
    std::lock_guard lock(state().calls);
    live = state().live;
  }
  for (auto it = live.rbegin(); it != live.rend(); ++it) release(*it, true);
  return MPI_SUCCESS;
}

/// How long the process's own aborts (at the job's end, at exit) wait for ncclCommAbort: the
/// harness aborts the job a moment later anyway.
constexpr std::chrono::milliseconds kProcessAbortLimit = std::chrono::seconds(2);

/// The harness ends the job: no rank may stay inside NCCL, and the exchanges waiting for a
/// failed peer throw, naming the reason.
void abort_at_job_end(std::string_view reason) {
  abort_all_nccl(fmt::format("the job ends: {}", reason), kProcessAbortLimit);
}

/// exit() with communicators still live (a rank that exits mid-test): they are aborted before
/// the CUDA runtime's own exit handlers (registered before this one) tear the device down under
/// NCCL's threads. Nothing to do after MPI_Finalize released them.
void abort_at_exit() {
  {
    std::unique_lock lock(state().calls, std::try_to_lock);
    if (lock.owns_lock() && state().live.empty()) return;
  }
  abort_all_nccl("the process exits", kProcessAbortLimit);
}

/// With the first communicator: abort_at_job_end as a job-end hook, abort_at_exit at exit.
void add_process_hooks() {
  if (state().process_hooks) return;
  add_job_end_hook(&abort_at_job_end);
  MESHTEST_DIST_CHECK(std::atexit(&abort_at_exit) == 0,
                      "cannot register the NCCL communicators' abort at exit (std::atexit)");
  state().process_hooks = true;
}

void add_finalize_hook() {
  if (state().finalize_hook || !mpi_active()) return;
  MESHTEST_MPI(MPI_Comm_set_attr(MPI_COMM_SELF, delete_only_keyval(&release_at_finalize), nullptr));
  state().finalize_hook = true;
}

}  // namespace

void nccl_check(ncclResult_t rc, ncclComm_t comm, const char* call, const char* file, int line) {
  if (rc == ncclSuccess || rc == ncclInProgress) return;
  const char* last = ncclGetLastError(comm);
  fail("NCCL error {} in `{}` ({}:{}): {}", ncclGetErrorString(rc), call, file, line,
       last != nullptr && *last != '\0' ? last : "no further detail from NCCL");
}

void cuda_check(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();  // a later check must not see a non-sticky error again
  fail("CUDA error {}: {} in `{}` ({}:{})", cudaGetErrorName(err), cudaGetErrorString(err), call,
       file, line);
}

NcclLock::NcclLock(std::string_view what) {
  state().calls.lock();
  if (state().aborted.load()) {
    state().calls.unlock();
    fail("NCCL communicators aborted ({}) before {}", nccl_abort_reason().value_or("?"), what);
  }
}

NcclLock::~NcclLock() { state().calls.unlock(); }

void track(ncclComm_t comm) {
  state().live.push_back(comm);
  add_finalize_hook();
  add_process_hooks();
}

void release(ncclComm_t comm, bool clean, std::chrono::milliseconds limit) noexcept {
  try {
    if (clean) {
      ncclResult_t rc = ncclSuccess;
      {
        NcclLock lock("ncclCommFinalize");
        if (std::find(state().live.begin(), state().live.end(), comm) == state().live.end()) return;
        rc = ncclCommFinalize(comm);
      }
      // Still live while it finalizes: an abort meanwhile aborts it.
      if ((rc == ncclSuccess || rc == ncclInProgress) &&
          poll_state(comm, "ncclCommFinalize", Clock::now() + limit) == ncclSuccess) {
        NcclLock lock("ncclCommDestroy");
        if (erase_live(comm)) ncclCommDestroy(comm);
        return;
      }
    }
    NcclLock lock("ncclCommAbort");
    if (erase_live(comm)) ncclCommAbort(comm);
  } catch (...) {
    // Aborted meanwhile: abort_all_nccl frees every live communicator.
  }
}

void settle(ncclComm_t comm, std::string_view what) {
  const ncclResult_t st = *poll_state(comm, what);
  if (st == ncclSuccess) return;
  NcclLock lock(what);
  nccl_check(st, comm, std::string(what).c_str(), __FILE__, __LINE__);
}

void wait_stream(cudaStream_t stream, ncclComm_t comm, std::string_view what) {
  Pace pace;
  for (;;) {
    if (comm != nullptr) {
      NcclLock lock(what);
      ncclResult_t st = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm, &st);
      nccl_check(rc != ncclSuccess ? rc : st, comm, std::string(what).c_str(), __FILE__, __LINE__);
    } else if (auto reason = nccl_abort_reason()) {
      fail("NCCL communicators aborted ({}) during {}", *reason, what);
    }
    const cudaError_t err = cudaStreamQuery(stream);
    if (err == cudaSuccess) return;
    if (err != cudaErrorNotReady) cuda_check(err, std::string(what).c_str(), __FILE__, __LINE__);
    pace.pause();
  }
}

bool abort_all_nccl(std::string_view reason, std::chrono::milliseconds limit) {
  State& s = state();
  {
    std::lock_guard lock(s.reason_mutex);
    if (!s.aborted.load()) s.reason = std::string(reason);
    s.aborted.store(true);  // from now on no thread starts an NCCL call
  }
  try {
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread([done, limit] {
      State& st = state();
      std::unique_lock lock(st.calls, std::defer_lock);
      if (!lock.try_lock_for(limit)) return;
      for (auto it = st.live.rbegin(); it != st.live.rend(); ++it) ncclCommAbort(*it);
      st.live.clear();
      done->store(true);
    }).detach();
    const auto until = Clock::now() + limit;
    while (!done->load() && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return done->load();
  } catch (...) {
    return false;  // no thread to abort on: the job ends without it
  }
}

std::optional<std::string> nccl_abort_reason() {
  std::lock_guard lock(state().reason_mutex);
  if (!state().aborted.load()) return std::nullopt;
  return state().reason;
}

int delete_only_keyval(MPI_Comm_delete_attr_function* on_delete) {
  int key = MPI_KEYVAL_INVALID;
  MESHTEST_MPI(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_delete, &key, nullptr));
  return key;
}

std::size_t live_nccl_comms() {
  std::lock_guard lock(state().calls);
  return state().live.size();
}

}  // namespace meshtest::dist::gpu
