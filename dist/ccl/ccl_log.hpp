// The last collective this process entered, for the test harness's hang reports.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "src/core/dtype.hpp"
#include "src/core/shape.hpp"

namespace meshtest::dist {

/// What a rank was doing in its most recent collective.
struct CollectiveEntry {
  std::string op;          ///< "all_reduce", ... (empty: none yet)
  std::uint64_t seq = 0;   ///< 1-based count of collectives entered by this process
  std::string detail;      ///< shape, dtype, axis, dims, ...
  bool completed = false;  ///< false while the rank is inside the collective
};

/// One "key value" of a collective's detail: the number, or `text` when it is not empty.
/// Keys and texts must be string literals (static storage): they are kept unformatted and
/// formatted only when read, so entering a collective costs no formatting.
struct LogField {
  std::string_view key;
  std::int64_t value = 0;
  std::string_view text = {};
};

/// Records entry into a collective on x (shape, dtype) with up to 4 detail fields; the
/// detail reads "f32[2, 3] dim 1 axis all". `op` must have static storage. Thread-safe (the
/// watchdog thread reads it).
void ccl_log_enter(std::string_view op, const Shape& shape, DType dtype,
                   std::span<const LogField> fields);
/// Marks the current collective as completed.
void ccl_log_exit();
/// A snapshot of the last collective entered.
CollectiveEntry ccl_log_last();
/// "all_reduce #12 f32[4, 8] axis 1 (waiting inside)" or "no collective entered yet".
std::string describe(const CollectiveEntry& e);

/// RAII: enter on construction, exit on destruction.
class CclLogScope {
 public:
  CclLogScope(std::string_view op, const Shape& shape, DType dtype,
              std::span<const LogField> fields) {
    ccl_log_enter(op, shape, dtype, fields);
  }
  ~CclLogScope() { ccl_log_exit(); }
  CclLogScope(const CclLogScope&) = delete;
  CclLogScope& operator=(const CclLogScope&) = delete;
};

}  // namespace meshtest::dist
