// The collectives this process entered: the last one for the test harness's hang reports, and
// the flight recorder of the last kFlightEntries (dumped to reports/flight/rank<r>.json).
#pragma once

#include <array>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/dtype.hpp"
#include "src/core/shape.hpp"
#include "src/perf/flight.hpp"

namespace meshtest::dist {

/// What a rank was doing in its most recent collective.
struct CollectiveEntry {
  std::string op;               ///< "all_reduce", ... (empty: none yet)
  std::uint64_t seq = 0;        ///< 1-based count of collectives entered by this process
  std::string detail;           ///< shape, dtype, axis, dims, ...
  bool completed = false;       ///< false while the rank is inside the collective
  std::uint64_t group_seq = 0;  ///< its count on its group's communicator (0: not agreed yet)
  std::vector<int> members;     ///< the group's ranks in MPI_COMM_WORLD, while inside after
                                ///< agreeing (else empty)
};

/// A communicator this process called collectives on: its ranks in MPI_COMM_WORLD (group
/// order) and how many collectives agreed on it so far.
struct GroupCount {
  std::vector<int> members;
  std::uint64_t calls = 0;
};

/// Every live communicator with at least one collective, and those freed since
/// ccl_forget_freed_groups (the most calls per group of ranks), in no particular order.
/// Thread-safe.
std::vector<GroupCount> ccl_group_counts();
/// Forgets the freed communicators (the harness calls it as each test starts).
void ccl_forget_freed_groups();

/// One "key value" of a collective's detail: the number, or `text` when it is not empty.
/// Keys and texts must be string literals (static storage): they are kept unformatted and
/// formatted only when read, so entering a collective costs no formatting.
struct LogField {
  std::string_view key;
  std::int64_t value = 0;
  std::string_view text = {};
};

/// How many collectives the flight recorder keeps.
inline constexpr std::size_t kFlightEntries = 64;

/// Records entry into a collective on x (shape, dtype) with up to 4 detail fields (the last
/// one the axis); the detail reads "f32[2, 3] dim 1 axis all". `op` must have static storage.
/// The entry is queued until ccl_log_agreeing. Thread-safe (the watchdog thread reads it).
void ccl_log_enter(std::string_view op, const Shape& shape, DType dtype,
                   std::span<const LogField> fields);
/// The current collective starts exchanging with its group (state waiting): its signature,
/// its count on the group's communicator and the group's world ranks (kept by pointer: they
/// must live as long as the communicator, and are read only while the collective runs).
void ccl_log_agreeing(std::uint64_t signature, std::uint64_t group_seq,
                      const std::vector<int>* members = nullptr);
/// Marks the current collective as completed (done, or failed when it threw).
void ccl_log_exit(bool failed = false);
/// A snapshot of the last collective entered.
CollectiveEntry ccl_log_last();
/// "all_reduce #12 f32[4, 8] axis 1 (waiting inside)" or "no collective entered yet".
std::string describe(const CollectiveEntry& e);

/// The flight recorder's entries (oldest first) as a dump of this rank, for `reason` while
/// doing `activity`.
perf::FlightDump ccl_flight(std::string reason, std::string activity);
/// Where flight_dump writes (the harness sets <reports>/flight); empty: nowhere. `activity`
/// (may be nullptr) says what the process is doing when a dump is made without saying it.
void set_flight_dir(std::filesystem::path dir, std::string (*activity)() = nullptr);
/// Writes ccl_flight(reason, activity) to <flight dir>/rank<r>.json (atomically) and returns
/// the path; nullopt when no flight dir is set or the file cannot be written (a dump is best
/// effort: it is made while things are already going wrong).
std::optional<std::filesystem::path> flight_dump(std::string reason, std::string activity);

/// RAII: enter on construction, exit on destruction (failed when an exception leaves it).
class CclLogScope {
 public:
  CclLogScope(std::string_view op, const Shape& shape, DType dtype,
              std::span<const LogField> fields)
      : exceptions_(std::uncaught_exceptions()) {
    ccl_log_enter(op, shape, dtype, fields);
  }
  ~CclLogScope() { ccl_log_exit(std::uncaught_exceptions() > exceptions_); }
  CclLogScope(const CclLogScope&) = delete;
  CclLogScope& operator=(const CclLogScope&) = delete;

 private:
  int exceptions_;
};

}  // namespace meshtest::dist
