// Test helper: synthetic profiled runs (op records with signposts) for the perf report tests.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "src/perf/op_record.hpp"

namespace meshtest::test_support {

/// An op of a synthetic run: code, type, attributes, inputs, outputs (times are filled in).
inline perf::OpRecord op_spec(std::string code, std::vector<perf::TensorInfo> in,
                              std::vector<perf::TensorInfo> out, std::string attributes = "",
                              perf::OpType type = perf::OpType::compute) {
  perf::OpRecord r;
  r.op_code = std::move(code);
  r.op_type = type;
  r.attributes = std::move(attributes);
  r.inputs = std::move(in);
  r.outputs = std::move(out);
  return r;
}

/// A profiled run on `devices` devices: each device runs `ops` once as warm-up, then
/// signpost "start", `iterations` copies of `ops`, signpost "stop". Op k of an iteration on
/// device d lasts 100 * (k + 1) + 10 * d ns; consecutive records are 5 ns apart.
inline std::vector<perf::OpRecord> profiled_run(int devices, const std::vector<perf::OpRecord>& ops,
                                                int iterations) {
  std::vector<perf::OpRecord> out;
  for (int d = 0; d < devices; ++d) {
    std::int64_t t = 1000, calls = 0;
    const auto push = [&](perf::OpRecord r, std::int64_t dur) {
      r.device_id = d;
      r.global_call_count = ++calls;
      r.start_ns = t;
      r.end_ns = t + dur;
      t = r.end_ns + 5;
      out.push_back(std::move(r));
    };
    const auto sign = [&](std::string name) {
      perf::OpRecord s;
      s.op_code = "signpost";
      s.op_type = perf::OpType::signpost;
      s.attributes = std::move(name);
      push(std::move(s), 0);
    };
    for (int it = -1; it < iterations; ++it) {
      if (it == 0) sign("start");
      for (std::size_t k = 0; k < ops.size(); ++k) {
        push(ops[k], 100 * static_cast<std::int64_t>(k + 1) + 10 * d);
      }
    }
    sign("stop");
  }
  return out;
}

}  // namespace meshtest::test_support
