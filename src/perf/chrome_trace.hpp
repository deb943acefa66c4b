// trace.json: op records as Chrome trace events (one process per device), for Perfetto or
// chrome://tracing.
#pragma once

#include <span>
#include <string>

#include "src/perf/op_record.hpp"

namespace meshtest::perf {

/// The Chrome trace-event JSON object {"traceEvents": [...], "displayTimeUnit": "ns"}: per
/// device id d a process (pid d) with "process_name" "device d" and "process_sort_index" d
/// metadata, thread 0 "ops" (host-timed ops) and, where the device has ops timed on a GPU
/// (OpRecord::timed_on_device), thread 1 "gpu (device time)" holding those; each op an "X"
/// complete event (ts, dur in microseconds since the earliest record;
/// cat = op type; args = call count, attributes, inputs, outputs, bytes, flops); each signpost
/// a process-scoped instant event ("i", s "p"). Throws Error for no records.
std::string chrome_trace_json(std::span<const OpRecord> records);

}  // namespace meshtest::perf
