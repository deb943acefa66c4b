// OpRecords as bytes (CBOR via nlohmann-json): how dist/perf ships records between devices.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "src/perf/op_record.hpp"

namespace meshtest::perf {

/// Encodes records (every field) as CBOR bytes.
std::vector<std::uint8_t> encode_records(std::span<const OpRecord> records);
/// Decodes bytes made by encode_records; throws Error when they are not such an encoding.
std::vector<OpRecord> decode_records(std::span<const std::uint8_t> bytes);

}  // namespace meshtest::perf
