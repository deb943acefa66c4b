// job_end: what a process does when the test harness ends its job — hooks that the layers below
// the harness register (dist/gpu: abort the NCCL communicators, so that no rank stays inside
// NCCL) and that the harness runs before it aborts the job.
#pragma once

#include <cstddef>
#include <string_view>

namespace meshtest::dist {

/// A job-end hook: told why the job ends (the harness's one-line reason). It runs on a thread of
/// the harness while the test's own threads may be stuck anywhere (inside a collective, in the
/// CUDA runtime), so it must not wait for them: it returns within a few seconds, whatever the
/// state of the process, and never takes a lock that such a thread may hold for long.
using JobEndHook = void (*)(std::string_view reason);

/// Most hooks a process can hold.
inline constexpr std::size_t kMaxJobEndHooks = 16;

/// Registers `hook` (not null) to run when the job ends; registering the same hook again does
/// nothing. Thread-safe. Throws meshtest::Error when kMaxJobEndHooks other hooks are held. A
/// hook registered after the job-end hooks ran does not run.
void add_job_end_hook(JobEndHook hook);

/// Runs every registered hook once, in the order of registration, with `reason`; an exception
/// out of a hook is dropped and the next hook runs. Only the process's first call runs them (the
/// job ends once): a later or concurrent call returns at once. Thread-safe; not
/// async-signal-safe (hooks take locks and start threads): call it from a thread, never from a
/// signal handler. Returns whether this call ran them.
bool run_job_end_hooks(std::string_view reason) noexcept;

}  // namespace meshtest::dist
