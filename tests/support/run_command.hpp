// Test helper: run a shell command (a program under test) and collect its output and exit code.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace meshtest::test_support {

struct CommandResult {
  int status = -1;  ///< exit code; -1 when the command could not start or did not exit
  std::string out;  ///< stdout and stderr
};

/// Runs `cmd` through /bin/sh with stderr merged into stdout and waits for it.
inline CommandResult run_command(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {};
  CommandResult r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace meshtest::test_support
