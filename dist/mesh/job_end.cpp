// job_end: the process's job-end hooks, held in a fixed table that is never destroyed.
#include "dist/mesh/job_end.hpp"

#include <array>
#include <atomic>
#include <mutex>

#include "src/core/error.hpp"

namespace meshtest::dist {
namespace {

/// Trivially destructible but for the mutex, which only registration takes: a job may end while
/// the process exits, after static destructors ran.
std::array<std::atomic<JobEndHook>, kMaxJobEndHooks> g_hooks{};
std::mutex g_adding;
std::atomic<bool> g_ran{false};

}  // namespace

void add_job_end_hook(JobEndHook hook) {
  MESHTEST_CHECK(hook != nullptr, "add_job_end_hook: the hook is null");
  std::lock_guard lock(g_adding);
  for (auto& slot : g_hooks) {
    const JobEndHook held = slot.load();
    if (held == hook) return;
    if (held == nullptr) {
      slot.store(hook);
      return;
    }
  }
  fail("add_job_end_hook: a process holds at most {} job-end hooks, and {} are registered",
       kMaxJobEndHooks, kMaxJobEndHooks);
}

bool run_job_end_hooks(std::string_view reason) noexcept {
  if (g_ran.exchange(true)) return false;
  for (auto& slot : g_hooks) {
    const JobEndHook hook = slot.load();
    if (hook == nullptr) break;
    try {
      hook(reason);
    } catch (...) {
      // The job ends anyway; the next hook still runs.
    }
  }
  return true;
}

}  // namespace meshtest::dist
