// Crash and exit hooks: a rank that crashes or exits mid-run says so before it disappears.
#pragma once

namespace meshtest::dist::testing::detail {

/// Installs handlers for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT that write
/// "[rank r/N] crashed with SIGSEGV in test X" (the activity: state.hpp's activity_for_signal)
/// to the original stderr (async-signal-safe), then hand the signal to the previous handler
/// (Open MPI's backtrace) or the default action. `stderr_fd` is the original stderr; with
/// `redirected`, the message also goes to fd 2 (the rank's log).
void install_crash_handlers(int rank, int size, int stderr_fd, bool redirected);

/// Registers (once) and arms an on_exit hook: a rank that exits before the harness finishes
/// tells rank 0's coordinator, which reports it with every rank's last collective and aborts
/// the job. If no abort comes, the hook reports by itself, runs the job-end hooks
/// (dist/mesh/job_end.hpp) and calls MPI_Abort.
void arm_exit_hook();

/// The harness finished (or is aborting the job itself): exit is expected from now on.
void disarm_exit_hook();

}  // namespace meshtest::dist::testing::detail
