// The flight recorder's files: each device's last collectives (reports/flight/rank<r>.json),
// read back and summarized as the first collective where the devices disagree or stopped.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshtest::perf {

/// Where a collective stood when the recorder was read: entered but not yet exchanging with
/// the group (queued), agreeing or exchanging with the group (waiting), returned (done), or
/// left by an exception (failed).
enum class FlightState { queued, waiting, done, failed };

std::string_view flight_state_name(FlightState s);

/// One collective of one device.
struct FlightEntry {
  std::uint64_t seq = 0;        ///< 1-based count of the collectives this process entered
  std::string op;               ///< "all_reduce", ...
  std::string axis;             ///< "0", "1" or "all"
  std::uint64_t group_seq = 0;  ///< count on its axis group's communicator (0: not agreed yet)
  std::uint64_t signature = 0;  ///< hash of op, axis, group size, options, dtype and shape (0:
                                ///< not agreed yet); the free dim of uneven pieces left out
  std::string detail;           ///< "f32[4, 8] op sum axis all"
  std::int64_t bytes = 0;       ///< bytes of this device's input
  std::int64_t start_us = 0;    ///< entry, microseconds since the Unix epoch
  std::int64_t end_us = -1;     ///< return, or -1 while inside
  FlightState state = FlightState::queued;
};

/// One device's dump.
struct FlightDump {
  int rank = 0;
  int size = 0;  ///< ranks in the job
  std::string host;
  std::int64_t pid = 0;
  std::string reason;    ///< "deadline", "desync", "rank 2 exited", ...
  std::string activity;  ///< "test Suite.Name", ...
  std::int64_t time_us = 0;
  std::vector<FlightEntry> entries;  ///< oldest first, consecutive seq
};

/// The largest job a dump may claim (its "size"), and the bound on a collective's seq: limits
/// that keep a hostile file from making the summary loop over 2^31 ranks or wrap a seq.
inline constexpr int kMaxFlightRanks = 1 << 20;
inline constexpr std::uint64_t kMaxFlightSeq = std::uint64_t{1} << 62;

std::string flight_json(const FlightDump& d);
/// Parses a dump; throws Error naming `source` and the field on anything malformed.
FlightDump parse_flight_json(std::string_view text, std::string_view source);
/// Every rank<r>.json in dir, by rank; throws Error when dir holds none.
std::vector<FlightDump> read_flight_dir(const std::filesystem::path& dir);

/// A screen of text: which ranks dumped, the first collective (by seq, over the history that
/// every dump still holds) where the ranks differ in op, axis or signature, where a rank has
/// no entry (it stopped before), or where one is not done; the ranks grouped by what they did
/// there; and each rank's last collective (beyond 16 dumps, one line per group of ranks with
/// the same last collective). Ranks are written as ranges ("ranks 0-499, 510-999"), so the
/// summary stays one screen at any job size. `size` ranks are expected (0: the dumps' size);
/// more than kMaxFlightRanks is an Error.
std::string flight_summary(std::span<const FlightDump> dumps, int size = 0);

}  // namespace meshtest::perf
