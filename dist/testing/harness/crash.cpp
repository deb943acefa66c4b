// Crash signal handlers and the mid-test exit hook.
#include "dist/testing/harness/crash.hpp"

#include <dlfcn.h>
#include <fmt/format.h>
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <ucontext.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "dist/mesh/job_end.hpp"
#include "dist/testing/harness/output.hpp"
#include "dist/testing/harness/protocol.hpp"
#include "dist/testing/harness/state.hpp"

namespace meshtest::dist::testing::detail {

namespace {

constexpr std::array<int, 5> kSignals = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
/// The crash message's size: its fixed words and one activity_for_signal() text.
constexpr std::size_t kTextSize = 1024;

// Read by the signal handler.
int g_rank = 0;
int g_size = 1;
int g_fd = 2;
bool g_redirected = false;
struct sigaction g_previous[NSIG];
std::atomic<bool> g_exit_armed{false};

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    default:
      return "a signal";
  }
}

/// Async-signal-safe append of a C string or a non-negative int to buf (bounded).
void append(char* buf, std::size_t& len, const char* s) {
  while (*s != '\0' && len + 1 < kTextSize) {
    buf[len++] = *s++;
  }
}
void append(char* buf, std::size_t& len, int v) {
  char digits[16];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0 && n < 15);
  while (n > 0 && len + 1 < kTextSize) {
    buf[len++] = digits[--n];
  }
}

/// Appends v in hex digits (async-signal-safe).
void append_hex(char* buf, std::size_t& len, std::uintptr_t v) {
  char digits[2 * sizeof v];
  int n = 0;
  do {
    digits[n++] = "0123456789abcdef"[v % 16];
    v /= 16;
  } while (v > 0 && n < static_cast<int>(sizeof digits));
  while (n > 0 && len + 1 < kTextSize) {
    buf[len++] = digits[--n];
  }
}

/// Appends " <module>+0x<offset>" for a code address (what addr2line -e <module> takes), or
/// the bare address when no loaded module holds it. dladdr is not on POSIX's async-signal-safe
/// list; a crashing process has nothing better to report where it was.
void append_code_address(char* buf, std::size_t& len, std::uintptr_t pc) {
  Dl_info where{};
  if (pc == 0 || dladdr(reinterpret_cast<void*>(pc), &where) == 0 || where.dli_fname == nullptr) {
    append(buf, len, " 0x");
    append_hex(buf, len, pc);
    return;
  }
  append(buf, len, " ");
  append(buf, len, where.dli_fname);
  append(buf, len, " +0x");
  append_hex(buf, len, pc - reinterpret_cast<std::uintptr_t>(where.dli_fbase));
  if (where.dli_sname != nullptr) {
    append(buf, len, " (");
    append(buf, len, where.dli_sname);
    append(buf, len, ")");
  }
}

/// For a fault (not a signal sent by a process): where it happened, " at <pc>", and the
/// return address on top of the stack, " called from <address>": after a call through a bad
/// pointer the pc is that pointer and the caller is the place to look.
void append_fault_site(char* buf, std::size_t& len, const siginfo_t* info, const void* context) {
#if defined(__x86_64__) && defined(REG_RIP)
  if (info == nullptr || info->si_code <= 0 || context == nullptr) return;
  const auto& regs = static_cast<const ucontext_t*>(context)->uc_mcontext.gregs;
  const auto pc = static_cast<std::uintptr_t>(regs[REG_RIP]);
  append(buf, len, ", at");
  append_code_address(buf, len, pc);
  if (info->si_signo == SIGSEGV && reinterpret_cast<std::uintptr_t>(info->si_addr) == pc) {
    // The pc itself could not be fetched: the caller pushed its return address just before.
    const auto* sp = reinterpret_cast<const std::uintptr_t*>(regs[REG_RSP]);
    append(buf, len, ", called from");
    append_code_address(buf, len, sp != nullptr ? *sp : 0);
  }
#else
  (void)buf, (void)len, (void)info, (void)context;
#endif
}

/// Whether `s` starts with `prefix` (async-signal-safe).
bool starts_with(const char* s, const char* prefix) {
  while (*prefix != '\0') {
    if (*s++ != *prefix++) return false;
  }
  return true;
}

void on_crash(int sig, siginfo_t* info, void* context) {
  char text[kTextSize];
  std::size_t len = 0;
  append(text, len, "[rank ");
  append(text, len, g_rank);
  append(text, len, "/");
  append(text, len, g_size);
  append(text, len, "] crashed with ");
  append(text, len, signal_name(sig));
  append(text, len, " ");
  const char* activity = activity_for_signal();
  if (starts_with(activity, "test ")) append(text, len, "in ");
  append(text, len, activity);
  append_fault_site(text, len, info, context);
  append(text, len, "\n");
  if (write(g_fd, text, len) < 0) { /* nothing left to try */
  }
  if (g_redirected && write(STDERR_FILENO, text, len) < 0) {
  }
  // Hand over to the previous handler: re-send a signal that was sent (raise, abort, kill);
  // for a real fault, returning re-executes the faulting instruction under that handler.
  sigaction(sig, &g_previous[sig], nullptr);
  if (info == nullptr || info->si_code <= 0) {
    raise(sig);
  }
}

void on_process_exit(int status, void* /*arg*/) {
  if (!g_exit_armed.exchange(false)) {
    return;
  }
  const Config& c = config();
  const Exited exited{.code = status, .activity = activity()};
  try {
    send(c.to_root, 0, kExited, encode(exited));
    // Rank 0's coordinator reports and calls MPI_Abort, which ends this process too.
    std::this_thread::sleep_for(c.failure_grace + std::chrono::seconds(10));
  } catch (...) {
  }
  const std::string message = fmt::format(
      "[rank {}/{}] exited with status {} in {} and rank 0 did not end the job; aborting", c.rank,
      c.size, status, exited.activity);
  write_original_stderr(message + "\n");
  run_job_end_hooks(message);
  MPI_Abort(MPI_COMM_WORLD, status != 0 ? status : 1);
}

}  // namespace

void install_crash_handlers(int rank, int size, int stderr_fd, bool redirected) {
  g_rank = rank;
  g_redirected = redirected;
  g_size = size;
  g_fd = stderr_fd;
  // An alternate stack lets the main thread report a stack overflow too.
  static std::array<char, 1 << 16> alt_stack;
  stack_t ss{};
  ss.ss_sp = alt_stack.data();
  ss.ss_size = alt_stack.size();
  sigaltstack(&ss, nullptr);
  for (int sig : kSignals) {
    struct sigaction sa {};
    sa.sa_sigaction = on_crash;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, &g_previous[sig]);
  }
}

void arm_exit_hook() {
  static const bool registered = [] { return on_exit(on_process_exit, nullptr) == 0; }();
  g_exit_armed.store(registered);
}

void disarm_exit_hook() { g_exit_armed.store(false); }

}  // namespace meshtest::dist::testing::detail
