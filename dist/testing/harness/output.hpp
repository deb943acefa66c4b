// Per-rank output: only rank 0 prints; other ranks write to <reports>/logs/rank<r>.log.
#pragma once

#include <string>
#include <string_view>

namespace meshtest::dist::testing::detail {

/// The reports directory: env MESHTEST_REPORTS_DIR, else "reports" (relative to the cwd).
std::string reports_dir();

/// <reports>/logs/rank<r>.log
std::string rank_log_path(int rank);

/// Saves the original stderr (see write_original_stderr). On a rank other than 0, also creates
/// <reports>/logs and sends stdout and stderr (the file descriptors, so C, C++ and MPI output
/// alike) to the rank's log, line-buffered. Returns true if output was redirected.
bool setup_rank_output(int rank, int size);

/// The process's stderr from before the redirect (a terminal or mpirun's forwarder).
int original_stderr_fd();

/// Writes `text` in one piece to the original stderr, after flushing stdout.
void write_original_stderr(std::string_view text);

}  // namespace meshtest::dist::testing::detail
