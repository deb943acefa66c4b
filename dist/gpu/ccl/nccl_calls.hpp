// nccl_calls: every NCCL call of the process goes through here — the error check, one lock, the
// live communicators, the waits that poll (so that a fault can interrupt them) and the abort hook.
//
// The communicators are blocking by default (an NCCL call returns once its work is queued; see
// docs/gpu.md for the measured cost of the other mode) and nonblocking under
// MESHTEST_NCCL_BLOCKING=0 (ncclConfig_t::blocking = 0: no NCCL call but ncclCommDestroy and
// ncclCommAbort waits for another rank). Either way a thread waits for the queued work by polling
// (settle, wait_stream) under a short hold of the process's NCCL lock per poll, never inside a
// blocking CUDA or NCCL wait; abort_all_nccl, called from another thread (the test harness's
// watchdog or coordinator), takes that lock between two polls, aborts every live communicator
// (ncclCommAbort) and makes every later poll or call throw meshtest::Error instead of waiting.
// The first communicator registers it as a job-end hook (dist/mesh/job_end.hpp: the test harness
// runs it on every rank as it ends a job) and at exit (a rank that exits mid-test).
#pragma once

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace meshtest::dist::gpu {

/// Throws meshtest::Error "[rank r] NCCL error <ncclGetErrorString(rc)> in `<call>` (file:line):
/// <ncclGetLastError(comm)>" unless rc is ncclSuccess or ncclInProgress (a nonblocking call still
/// running: settle() waits for it). Call it holding the NcclLock.
void nccl_check(ncclResult_t rc, ncclComm_t comm, const char* call, const char* file, int line);

/// Throws meshtest::Error "[rank r] CUDA error <name>: <string> in `<call>` (file:line)" unless
/// err is cudaSuccess.
void cuda_check(cudaError_t err, const char* call, const char* file, int line);

/// The process's NCCL lock, held for one short sequence of NCCL calls (none of which blocks on
/// another rank). Throws meshtest::Error "[rank r] NCCL communicators aborted (<reason>) before
/// <what>" once abort_all_nccl has run, so that nothing touches an aborted communicator.
class NcclLock {
 public:
  explicit NcclLock(std::string_view what);
  ~NcclLock();
  NcclLock(const NcclLock&) = delete;
  NcclLock& operator=(const NcclLock&) = delete;
};

/// Enters a communicator that ncclCommInitRankConfig or ncclCommSplit just returned (ready or
/// still in progress) into the live set, which abort_all_nccl aborts and MPI_Finalize releases
/// (in reverse order of creation). The first call also registers abort_all_nccl (its limit 2 s)
/// as a job-end hook, reason "the job ends: <the harness's reason>", and at exit, reason "the
/// process exits" (when communicators are still live then). Call it holding the NcclLock.
void track(ncclComm_t comm);

/// Takes comm out of the live set and frees it. `clean`: ncclCommFinalize, polled until the
/// communicator is quiescent (for at most `limit`), then ncclCommDestroy; otherwise, or when
/// finalizing fails or runs out of time, ncclCommAbort. Nothing when comm is not live (never
/// tracked, released before, or aborted by abort_all_nccl). Never throws.
void release(ncclComm_t comm, bool clean,
             std::chrono::milliseconds limit = std::chrono::seconds(10)) noexcept;

/// Polls comm's state until its last nonblocking call has finished; throws meshtest::Error
/// naming `what` when that call failed (the communicator's asynchronous error), or when the
/// communicators are aborted meanwhile.
void settle(ncclComm_t comm, std::string_view what);

/// Polls until everything queued on `stream` has finished: cudaStreamQuery, and between two
/// queries comm's asynchronous error (a peer's failure that NCCL detected) and the abort flag.
/// Throws meshtest::Error naming `what` on a CUDA error (a fault of a kernel on the stream), an
/// NCCL error or an abort; never blocks in the CUDA runtime or in NCCL.
void wait_stream(cudaStream_t stream, ncclComm_t comm, std::string_view what);

/// The abort hook. Thread-safe and idempotent: makes every later NcclLock, settle and
/// wait_stream of any thread throw (naming `reason`), then calls ncclCommAbort on every live
/// communicator this process made, on a thread of its own, waiting for it at most `limit` (an
/// abort that hangs must not keep a job from ending). Returns whether every abort finished
/// within `limit`. Not async-signal-safe: call it from a thread, never from a signal handler.
bool abort_all_nccl(std::string_view reason,
                    std::chrono::milliseconds limit = std::chrono::seconds(5));

/// The reason given to abort_all_nccl, or nullopt while the communicators are not aborted.
std::optional<std::string> nccl_abort_reason();

/// Number of live communicators (made, neither released nor aborted).
std::size_t live_nccl_comms();

/// A new MPI attribute key whose values `on_delete` frees when their communicator is freed
/// (inside MPI_Comm_free, or at MPI_Finalize for MPI_COMM_SELF's); not copied to duplicates.
int delete_only_keyval(MPI_Comm_delete_attr_function* on_delete);

}  // namespace meshtest::dist::gpu

/// Checks an NCCL call on `comm` (which may be null for calls that have none).
#define MESHTEST_NCCL(call, comm) \
  ::meshtest::dist::gpu::nccl_check((call), (comm), #call, __FILE__, __LINE__)

/// Checks a CUDA runtime call in dist code (the message names the rank).
#define MESHTEST_DIST_CUDA(call) \
  ::meshtest::dist::gpu::cuda_check((call), #call, __FILE__, __LINE__)
