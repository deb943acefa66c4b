// The last collective this process entered, for the test harness's hang reports.
#pragma once

#include <cstdint>
#include <string>

namespace meshtest::dist {

/// What a rank was doing in its most recent collective.
struct CollectiveEntry {
  std::string op;          ///< "all_reduce", ... (empty: none yet)
  std::uint64_t seq = 0;   ///< 1-based count of collectives entered by this process
  std::string detail;      ///< shape, dtype, axis, dims, ...
  bool completed = false;  ///< false while the rank is inside the collective
};

/// Records entry into a collective; thread-safe (the watchdog thread reads it).
void ccl_log_enter(std::string op, std::string detail);
/// Marks the current collective as completed.
void ccl_log_exit();
/// A snapshot of the last collective entered.
CollectiveEntry ccl_log_last();
/// "all_reduce #12 f32[4, 8] axis 1 (waiting inside)" or "no collective entered yet".
std::string describe(const CollectiveEntry& e);

/// RAII: enter on construction, exit on destruction.
class CclLogScope {
 public:
  CclLogScope(std::string op, std::string detail) {
    ccl_log_enter(std::move(op), std::move(detail));
  }
  ~CclLogScope() { ccl_log_exit(); }
  CclLogScope(const CclLogScope&) = delete;
  CclLogScope& operator=(const CclLogScope&) = delete;
};

}  // namespace meshtest::dist
