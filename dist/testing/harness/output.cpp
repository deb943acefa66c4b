// Per-rank log files and the saved original stderr.
#include "dist/testing/harness/output.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace meshtest::dist::testing::detail {

namespace {
int g_original_stderr = STDERR_FILENO;
}  // namespace

std::string reports_dir() {
  const char* dir = std::getenv("MESHTEST_REPORTS_DIR");
  return dir != nullptr && *dir != '\0' ? dir : "reports";
}

std::string rank_log_path(int rank) {
  return fmt::format("{}/logs/rank{}.log", reports_dir(), rank);
}

bool setup_rank_output(int rank, int size) {
  // Keep the original stderr open (close-on-exec, so test children do not inherit it).
  const int saved = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
  if (saved >= 0) {
    g_original_stderr = saved;
  }
  if (rank == 0) {
    return false;
  }

  const std::string path = rank_log_path(rank);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const std::string warning =
        fmt::format("[rank {}/{}] cannot open {} ({}); this rank's output is discarded\n", rank,
                    size, path, std::strerror(errno));
    write_original_stderr(warning);
    fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      return false;
    }
  }
  std::fflush(stdout);
  std::fflush(stderr);
  dup2(fd, STDOUT_FILENO);
  dup2(fd, STDERR_FILENO);
  close(fd);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return true;
}

int original_stderr_fd() { return g_original_stderr; }

void write_original_stderr(std::string_view text) {
  std::fflush(stdout);
  while (!text.empty()) {
    const ssize_t n = write(g_original_stderr, text.data(), text.size());
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return;
    }
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace meshtest::dist::testing::detail
