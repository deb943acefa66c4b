// The ops_perf_<name>.csv report (columns modelled on mesh-device perf reports): writer and a
// validating reader.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/perf/op_record.hpp"

namespace meshtest::perf {

/// The leading columns, in order; then INPUT_<i>_{W,Z,Y,X,DATATYPE,MEMORY} for every input
/// index used by any row, then the same for OUTPUT_<i>.
inline constexpr std::array<std::string_view, 7> kOpsCsvColumns = {"OP CODE",
                                                                   "OP TYPE",
                                                                   "GLOBAL CALL COUNT",
                                                                   "DEVICE ID",
                                                                   "ATTRIBUTES",
                                                                   "DEVICE KERNEL DURATION [ns]",
                                                                   "OP TO OP LATENCY [ns]"};

/// A shape right-aligned into the 4 dims W, Z, Y, X: missing leading dims are 1 ([32, 64] ->
/// 1, 1, 32, 64); dims beyond 4 are folded into W ([2, 3, 4, 5, 6] -> 6, 4, 5, 6).
std::array<std::int64_t, 4> wzyx(const Shape& s);

/// Every INPUT_/OUTPUT_ column of a record as (column name, cell text), inputs first.
std::vector<std::pair<std::string, std::string>> tensor_fields(const OpRecord& r);

/// The CSV text: a header and one row per record (signposts included), grouped by device id
/// (each device's records in call order). Cells with ',', '"' or newlines are quoted.
std::string ops_csv(std::span<const OpRecord> records);

/// Records read back from an ops_perf CSV. Durations and latencies are exact; start/end times
/// are rebuilt per device from them (the first op of a device starts at 0).
struct OpsReport {
  std::string source;              ///< file name (for messages)
  std::vector<OpRecord> records;   ///< in file order
  std::vector<std::size_t> lines;  ///< 1-based line of each record in the file
};

/// Parses CSV text. Throws Error naming the source, line and column for: an empty file or no
/// rows; a missing leading column or an incomplete INPUT_/OUTPUT_ column group; a row with the
/// wrong number of cells; an unknown op type or dtype; a bad number; and (via
/// measured_region) no start/stop signposts or devices with mismatched op counts/sequences.
OpsReport parse_ops_csv(std::string_view text, std::string source = "<csv>");
/// Reads and parses a file; throws Error when it cannot be read.
OpsReport read_ops_csv(const std::filesystem::path& path);

}  // namespace meshtest::perf
