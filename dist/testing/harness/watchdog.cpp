// The control thread's life cycle, the watchdog of ranks 1..N-1, and the main thread's exchange.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <exception>
#include <string>
#include <thread>

#include "dist/mesh/job_end.hpp"
#include "dist/testing/harness/control.hpp"
#include "dist/testing/harness/crash.hpp"
#include "dist/testing/harness/output.hpp"

namespace meshtest::dist::testing::detail {

namespace {

std::thread* g_thread = nullptr;  // never destroyed: exit() mid-test must not join or terminate
std::atomic<bool> g_stop{false};

/// Answers the coordinator's queries with this rank's snapshot until stopped. A query with a
/// dump reason comes only as the coordinator ends the job: after answering it, the watchdog
/// runs this rank's job-end hooks.
void run_watchdog() {
  const Config& c = config();
  while (!g_stop.load()) {
    if (auto query = try_receive(c.from_root, 0, kQuery)) {
      const auto [id, dump] = decode_query(query->bytes);
      send(c.to_root, 0, kSnapshot,
           encode(dump.empty() ? snapshot(id) : snapshot_with_flight(id, dump)));
      if (!dump.empty()) run_job_end_hooks(dump);
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void guarded(void (*body)()) {
  try {
    body();
  } catch (const std::exception& e) {
    const Config& c = config();
    disarm_exit_hook();
    const std::string message = fmt::format(
        "[rank {}/{}] meshtest harness control thread failed: {}", c.rank, c.size, e.what());
    write_original_stderr(message + "\n");
    run_job_end_hooks(message);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

}  // namespace

void start_control_thread() {
  g_stop.store(false);
  g_thread = new std::thread(guarded, config().rank == 0 ? run_coordinator : run_watchdog);
}

void stop_control_thread() {
  g_stop.store(true);
  if (g_thread != nullptr && g_thread->joinable()) {
    g_thread->join();
  }
}

Verdict exchange(const Arrival& arrival) {
  const Config& c = config();
  send(c.to_root, 0, kArrive, encode(arrival));
  return decode_verdict(receive(c.from_root, 0, kVerdict).bytes);
}

}  // namespace meshtest::dist::testing::detail
