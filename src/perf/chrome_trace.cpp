// trace.json: Chrome trace events from op records.
#include "src/perf/chrome_trace.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

#include "src/core/error.hpp"

namespace meshtest::perf {

namespace {

using nlohmann::json;

/// The thread id of a device's GPU track: ops timed by the device's own events.
constexpr int kGpuTrack = 1;

json tensor_list(const std::vector<TensorInfo>& ts) {
  json out = json::array();
  for (const TensorInfo& t : ts) {
    out.push_back(fmt::format("{} {} {}", t.shape, dtype_name(t.dtype), t.memory));
  }
  return out;
}

}  // namespace

std::string chrome_trace_json(std::span<const OpRecord> records) {
  MESHTEST_CHECK(!records.empty(), "chrome trace: no op records to write");
  std::int64_t t0 = records[0].start_ns;
  std::set<int> devices, with_gpu_track;
  for (const OpRecord& r : records) {
    t0 = std::min(t0, r.start_ns);
    devices.insert(r.device_id);
    if (r.timed_on_device) with_gpu_track.insert(r.device_id);
  }
  json events = json::array();
  for (int d : devices) {
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", d},
                      {"tid", 0},
                      {"args", {{"name", fmt::format("device {}", d)}}}});
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", d},
                      {"tid", 0},
                      {"args", {{"sort_index", d}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", d},
                      {"tid", 0},
                      {"args", {{"name", "ops"}}}});
    if (with_gpu_track.contains(d)) {
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", d},
                        {"tid", kGpuTrack},
                        {"args", {{"name", "gpu (device time)"}}}});
    }
  }
  const auto us = [t0](std::int64_t ns) { return static_cast<double>(ns - t0) / 1e3; };
  for (const OpRecord& r : records) {
    if (r.op_type == OpType::signpost) {
      events.push_back({{"ph", "i"},
                        {"s", "p"},
                        {"name", r.attributes},
                        {"cat", "signpost"},
                        {"pid", r.device_id},
                        {"tid", 0},
                        {"ts", us(r.start_ns)}});
      continue;
    }
    events.push_back({{"ph", "X"},
                      {"name", r.op_code},
                      {"cat", op_type_name(r.op_type)},
                      {"pid", r.device_id},
                      {"tid", r.timed_on_device ? kGpuTrack : 0},
                      {"ts", us(r.start_ns)},
                      {"dur", static_cast<double>(r.duration_ns()) / 1e3},
                      {"args",
                       {{"global_call_count", r.global_call_count},
                        {"attributes", r.attributes},
                        {"inputs", tensor_list(r.inputs)},
                        {"outputs", tensor_list(r.outputs)},
                        {"bytes", r.bytes},
                        {"flops", r.flops}}}});
  }
  return json{{"displayTimeUnit", "ns"}, {"traceEvents", std::move(events)}}.dump(1);
}

}  // namespace meshtest::perf
