// OpRecord: what the profiler keeps of one op call on one device (docs/perf.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/dtype.hpp"
#include "src/core/shape.hpp"

namespace meshtest::perf {

/// compute: a kernel on one device; ccl: a collective (aggregated by the mean over devices);
/// signpost: a "start" / "stop" marker that bounds the measured region (zero duration).
enum class OpType : std::uint8_t { compute, ccl, signpost };

/// "compute", "ccl", "signpost".
std::string_view op_type_name(OpType t);
/// Parses a name made by op_type_name; throws Error naming the text otherwise.
OpType op_type_from_name(std::string_view name);

/// One input or output tensor of an op: its shape, dtype and memory (the placement on the
/// mesh, e.g. "Shard(1)", or "DEVICE" for a plain local tensor).
struct TensorInfo {
  Shape shape = {};
  DType dtype = DType::f32;
  std::string memory = "DEVICE";
  bool operator==(const TensorInfo&) const = default;
};

/// One op call on one device. Kernel duration = end_ns - start_ns; op-to-op latency =
/// start_ns - end_ns of the previous record on the same device.
struct OpRecord {
  std::string op_code;  ///< "rms_norm", "all_gather", "signpost", ...
  OpType op_type = OpType::compute;
  int device_id = 0;
  std::int64_t global_call_count = 0;  ///< 1-based, per process, in call order
  std::string attributes;  ///< op attributes as "key=value;key=value" (signposts: the name)
  std::vector<TensorInfo> inputs;
  std::vector<TensorInfo> outputs;
  std::int64_t start_ns = 0;  ///< steady clock
  std::int64_t end_ns = 0;
  std::int64_t bytes = 0;  ///< bytes moved (CCLs: bytes sent + received by this device)
  double flops = 0;
  /// The times came from the device the op ran on (CUDA events: OpScope::device_times), not
  /// the host clock; the trace shows such ops on the device's GPU track.
  bool timed_on_device = false;

  std::int64_t duration_ns() const { return end_ns - start_ns; }
};

}  // namespace meshtest::perf
