// Cross-device aggregation of op records (docs/perf.md): the measured region, its
// iterations, the slowest device for compute ops and the mean over devices for CCLs, then the
// average over iterations. Pure functions over records: no MPI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "src/perf/op_record.hpp"

namespace meshtest::perf {

/// Kernel duration and op-to-op latency of one record.
struct OpTiming {
  std::int64_t kernel_ns = 0;    ///< end - start (0 for signposts)
  std::int64_t op_to_op_ns = 0;  ///< start - end of the previous op of the same device
};

/// The timing of every record, in the records' order. The previous op of a record is the
/// latest earlier non-signpost record with the same device id (records of one device are in
/// call order); a device's first op has latency 0. Signposts are not ops: they get duration 0
/// and do not move "the previous op".
std::vector<OpTiming> op_timings(std::span<const OpRecord> records);

/// How the measured region is split into iterations.
struct AggregateOptions {
  /// 0: every "start" ... "stop" signpost pair is one iteration (ops between a "stop" and the
  /// next "start" are not measured). n > 0: with one pair, its ops split into n equal
  /// consecutive iterations; with several pairs, there must be exactly n of them.
  int iterations = 0;
  /// Expected number of devices (0: any). Records of another number of devices are an error.
  int devices = 0;
};

/// The measured region of every device: [device][iteration][op] = index into the records.
struct Region {
  std::vector<int> device_ids;  ///< ascending
  std::vector<std::vector<std::vector<std::size_t>>> ops;
  int iterations() const { return ops.empty() ? 0 : static_cast<int>(ops[0].size()); }
  std::size_t ops_per_iteration() const { return ops.empty() ? 0 : ops[0][0].size(); }
};

/// Keeps each device's records between its first "start" and its last "stop" signpost and
/// splits them into iterations. Throws Error for: no records; a device without a "start" or
/// "stop" signpost (or a stop before the start, or a start inside an open iteration); an empty
/// iteration; ops that do not split into the given iterations; another number of devices than
/// opts.devices; devices or iterations whose op sequences (op code and type, position by
/// position) or counts differ.
Region measured_region(std::span<const OpRecord> records, const AggregateOptions& opts = {});

/// One op position of the iteration, merged over devices and averaged over iterations.
struct OpSummary {
  int index = 0;  ///< 0-based position in the iteration
  std::string op_code;
  OpType op_type = OpType::compute;
  std::string attributes;  ///< the lowest device id's row in the first measured iteration
  std::vector<TensorInfo> inputs;
  std::vector<TensorInfo> outputs;
  int devices = 0;
  double kernel_duration_us = 0;   ///< average over iterations of the merged duration
  double op_to_op_latency_us = 0;  ///< average over iterations of the merged latency
};

/// The aggregated report: per-op averages and their sums.
struct Aggregate {
  int devices = 0;
  int iterations = 0;
  std::vector<OpSummary> ops;
  double total_kernel_duration_us = 0;   ///< sum of the ops' kernel_duration_us
  double total_op_to_op_latency_us = 0;  ///< sum of the ops' op_to_op_latency_us
};

/// The mesh-device aggregation. For each iteration and op position, merge the devices' rows:
/// a CCL takes the mean over devices of the kernel duration (and of the op-to-op latency);
/// any other op takes the row of the slowest device (largest kernel duration, lowest device
/// id on ties), i.e. its duration and its op-to-op latency. Then each op position is averaged
/// over the measured iterations; the totals are the sums over op positions. Throws like
/// measured_region.
Aggregate aggregate(std::span<const OpRecord> records, const AggregateOptions& opts = {});

}  // namespace meshtest::perf
