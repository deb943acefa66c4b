// Cross-device aggregation of op records: measured region, iterations, max / mean merge.
#include "src/perf/aggregate.hpp"

#include <algorithm>
#include <map>

#include "src/core/error.hpp"

namespace meshtest::perf {

namespace {

bool is_signpost(const OpRecord& r, std::string_view name) {
  return r.op_type == OpType::signpost && r.attributes == name;
}

/// One device's region split into its start/stop pairs: [pair][op] = record index.
std::vector<std::vector<std::size_t>> device_pairs(std::span<const OpRecord> records,
                                                   const std::vector<std::size_t>& mine, int dev) {
  std::size_t first = mine.size(), last = mine.size();
  for (std::size_t k = 0; k < mine.size(); ++k) {
    if (first == mine.size() && is_signpost(records[mine[k]], "start")) first = k;
    if (is_signpost(records[mine[k]], "stop")) last = k;
  }
  MESHTEST_CHECK(first != mine.size(),
                 "perf records of device {}: no \"start\" signpost; call perf::signpost(\"start\") "
                 "before the measured iterations and perf::signpost(\"stop\") after them",
                 dev);
  MESHTEST_CHECK(last != mine.size() && last > first,
                 "perf records of device {}: no \"stop\" signpost after the first \"start\" "
                 "signpost (global call count {})",
                 dev, records[mine[first]].global_call_count);
  std::vector<std::vector<std::size_t>> pairs;
  bool open = false;
  for (std::size_t k = first; k <= last; ++k) {
    const OpRecord& r = records[mine[k]];
    if (is_signpost(r, "start")) {
      MESHTEST_CHECK(!open,
                     "perf records of device {}: \"start\" signpost (global call count {}) inside "
                     "an iteration that has not been closed by \"stop\"",
                     dev, r.global_call_count);
      open = true;
      pairs.emplace_back();
    } else if (is_signpost(r, "stop")) {
      MESHTEST_CHECK(open,
                     "perf records of device {}: \"stop\" signpost (global call count {}) "
                     "without a \"start\" before it",
                     dev, r.global_call_count);
      MESHTEST_CHECK(!pairs.back().empty(),
                     "perf records of device {}: iteration {} between signposts has no ops", dev,
                     pairs.size() - 1);
      open = false;
    } else if (open && r.op_type != OpType::signpost) {
      pairs.back().push_back(mine[k]);
    }
  }
  return pairs;
}

/// Splits the pairs into iterations as opts.iterations says.
std::vector<std::vector<std::size_t>> split_iterations(std::vector<std::vector<std::size_t>> pairs,
                                                       int iterations, int dev) {
  MESHTEST_CHECK(iterations >= 0, "perf aggregation: iterations must be >= 0, got {}", iterations);
  const auto n = static_cast<std::size_t>(iterations);
  if (n == 0 || n == pairs.size()) return pairs;
  MESHTEST_CHECK(pairs.size() == 1,
                 "perf records of device {}: {} iterations were given but the measured region "
                 "has {} start/stop signpost pairs (expected 1 pair to split, or {} pairs)",
                 dev, n, pairs.size(), n);
  const std::vector<std::size_t>& all = pairs[0];
  MESHTEST_CHECK(all.size() % n == 0,
                 "perf records of device {}: {} ops between the signposts do not split into {} "
                 "equal iterations",
                 dev, all.size(), n);
  const std::size_t per = all.size() / n;
  std::vector<std::vector<std::size_t>> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i].assign(all.begin() + static_cast<std::ptrdiff_t>(i * per),
                  all.begin() + static_cast<std::ptrdiff_t>((i + 1) * per));
  }
  return out;
}

std::string describe(const OpRecord& r) {
  return fmt::format("'{}' ({})", r.op_code, op_type_name(r.op_type));
}

}  // namespace

std::vector<OpTiming> op_timings(std::span<const OpRecord> records) {
  std::vector<OpTiming> out(records.size());
  std::map<int, std::int64_t> previous_end;
  for (std::size_t k = 0; k < records.size(); ++k) {
    const OpRecord& r = records[k];
    const auto prev = previous_end.find(r.device_id);
    out[k].op_to_op_ns = prev == previous_end.end() ? 0 : r.start_ns - prev->second;
    if (r.op_type == OpType::signpost) continue;
    out[k].kernel_ns = r.duration_ns();
    previous_end[r.device_id] = r.end_ns;
  }
  return out;
}

Region measured_region(std::span<const OpRecord> records, const AggregateOptions& opts) {
  MESHTEST_CHECK(!records.empty(),
                 "perf aggregation: no op records (was profiling enabled, "
                 "e.g. with perf::Session?)");
  std::map<int, std::vector<std::size_t>> by_device;
  for (std::size_t k = 0; k < records.size(); ++k) by_device[records[k].device_id].push_back(k);
  MESHTEST_CHECK(opts.devices <= 0 || static_cast<int>(by_device.size()) == opts.devices,
                 "perf aggregation: records of {} devices, expected {}", by_device.size(),
                 opts.devices);
  Region region;
  for (const auto& [dev, mine] : by_device) {
    region.device_ids.push_back(dev);
    region.ops.push_back(split_iterations(device_pairs(records, mine, dev), opts.iterations, dev));
  }
  // Every device and iteration must run the op sequence of device 0's first iteration.
  const auto& ref = region.ops[0][0];
  for (std::size_t d = 0; d < region.ops.size(); ++d) {
    const auto& iters = region.ops[d];
    MESHTEST_CHECK(iters.size() == region.ops[0].size(),
                   "perf records: device {} has {} iterations, device {} has {}",
                   region.device_ids[d], iters.size(), region.device_ids[0], region.ops[0].size());
    for (std::size_t i = 0; i < iters.size(); ++i) {
      MESHTEST_CHECK(iters[i].size() == ref.size(),
                     "perf records: device {} runs {} ops in iteration {}, device {} runs {} in "
                     "iteration 0 (mismatched op counts)",
                     region.device_ids[d], iters[i].size(), i, region.device_ids[0], ref.size());
      for (std::size_t p = 0; p < ref.size(); ++p) {
        const OpRecord& a = records[ref[p]];
        const OpRecord& b = records[iters[i][p]];
        MESHTEST_CHECK(a.op_code == b.op_code && a.op_type == b.op_type,
                       "perf records: op {} of iteration {} on device {} is {}, but op {} of "
                       "iteration 0 on device {} is {} (mismatched op sequences)",
                       p, i, region.device_ids[d], describe(b), p, region.device_ids[0],
                       describe(a));
      }
    }
  }
  return region;
}

Aggregate aggregate(std::span<const OpRecord> records, const AggregateOptions& opts) {
  const Region region = measured_region(records, opts);
  const std::vector<OpTiming> timing = op_timings(records);
  Aggregate out;
  out.devices = static_cast<int>(region.device_ids.size());
  out.iterations = region.iterations();
  const std::size_t devices = region.ops.size();
  for (std::size_t p = 0; p < region.ops_per_iteration(); ++p) {
    const OpRecord& first = records[region.ops[0][0][p]];
    OpSummary op{.index = static_cast<int>(p),
                 .op_code = first.op_code,
                 .op_type = first.op_type,
                 .attributes = first.attributes,
                 .inputs = first.inputs,
                 .outputs = first.outputs,
                 .devices = out.devices};
    double kernel_sum = 0, latency_sum = 0;  // over iterations, in ns
    for (int i = 0; i < out.iterations; ++i) {
      const auto at = [&](std::size_t d) {
        return timing[region.ops[d][static_cast<std::size_t>(i)][p]];
      };
      if (first.op_type == OpType::ccl) {
        double k = 0, l = 0;
        for (std::size_t d = 0; d < devices; ++d) {
          k += static_cast<double>(at(d).kernel_ns);
          l += static_cast<double>(at(d).op_to_op_ns);
        }
        kernel_sum += k / static_cast<double>(devices);
        latency_sum += l / static_cast<double>(devices);
      } else {
        std::size_t slowest = 0;
        for (std::size_t d = 1; d < devices; ++d) {
          if (at(d).kernel_ns > at(slowest).kernel_ns) slowest = d;
        }
        kernel_sum += static_cast<double>(at(slowest).kernel_ns);
        latency_sum += static_cast<double>(at(slowest).op_to_op_ns);
      }
    }
    op.kernel_duration_us = kernel_sum / out.iterations / 1e3;
    op.op_to_op_latency_us = latency_sum / out.iterations / 1e3;
    out.total_kernel_duration_us += op.kernel_duration_us;
    out.total_op_to_op_latency_us += op.op_to_op_latency_us;
    out.ops.push_back(std::move(op));
  }
  return out;
}

}  // namespace meshtest::perf
