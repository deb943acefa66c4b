// The last-collective record read by the harness watchdog.
#include "dist/ccl/ccl_log.hpp"

#include <fmt/format.h>

#include <mutex>

namespace meshtest::dist {

namespace {
std::mutex g_mutex;
CollectiveEntry g_last;
}  // namespace

void ccl_log_enter(std::string op, std::string detail) {
  std::lock_guard lock(g_mutex);
  g_last.op = std::move(op);
  g_last.detail = std::move(detail);
  g_last.completed = false;
  ++g_last.seq;
}

void ccl_log_exit() {
  std::lock_guard lock(g_mutex);
  g_last.completed = true;
}

CollectiveEntry ccl_log_last() {
  std::lock_guard lock(g_mutex);
  return g_last;
}

std::string describe(const CollectiveEntry& e) {
  if (e.op.empty()) return "no collective entered yet";
  return fmt::format("{} #{} {} ({})", e.op, e.seq, e.detail,
                     e.completed ? "completed" : "waiting inside");
}

}  // namespace meshtest::dist
