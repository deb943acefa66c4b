// Test helper: run a shell command (a program under test) under a time limit and collect its
// output and exit code.
#pragma once

#include <fmt/format.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace meshtest::test_support {

/// Seconds a command may run before run_command stops it: a hung program (or mpirun job) fails
/// its test instead of blocking the test run.
inline constexpr int kCommandTimeoutSeconds = 120;

/// Exit code of a command that run_command stopped at its time limit (coreutils timeout).
inline constexpr int kTimedOutStatus = 124;

struct CommandResult {
  int status = -1;         ///< exit code; -1 when the command could not start or did not exit
  std::string out;         ///< stdout and stderr
  bool timed_out = false;  ///< stopped at the time limit (status 124, or 137 after SIGKILL)
};

/// `s` as one /bin/sh word: in single quotes, each ' written as '\''.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (const char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

/// Runs `cmd` through /bin/sh with stderr merged into stdout and waits for it, at most
/// `timeout_seconds`: then coreutils timeout sends SIGTERM to the command's process group
/// (mpirun and its ranks included) and SIGKILL 5 s later. A stopped command gets status 124
/// (137 when SIGKILL was needed), timed_out set and a line "run_command: timed out after N s:
/// <cmd>" at the end of its output; a command that exits 124 or 137 itself before the limit is
/// not reported as timed out.
inline CommandResult run_command(const std::string& cmd,
                                 int timeout_seconds = kCommandTimeoutSeconds) {
  const std::string wrapped =
      fmt::format("timeout -k 5 {} /bin/sh -c {} 2>&1", timeout_seconds, shell_quote(cmd));
  const auto start = std::chrono::steady_clock::now();
  FILE* p = ::popen(wrapped.c_str(), "r");
  if (p == nullptr) return {};
  CommandResult r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  const bool late =
      std::chrono::steady_clock::now() - start >= std::chrono::seconds(timeout_seconds);
  r.timed_out = late && (r.status == kTimedOutStatus || r.status == 128 + 9);
  if (r.timed_out) {
    r.out += fmt::format("\nrun_command: timed out after {} s (exit {}): {}\n", timeout_seconds,
                         r.status, cmd);
  }
  return r;
}

}  // namespace meshtest::test_support
