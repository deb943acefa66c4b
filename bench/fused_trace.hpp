// trace_vs_eager: the figure of the target "trace replay lowers total op-to-op latency
// against eager" — the gpt-oss attention front (qkv_rope then sdpa_sinks) run eagerly and by
// perf::Trace replay, both profiled and aggregated. For a `meshtest-bench fused` subcommand.
#pragma once

#include <cstdint>

#include "src/core/dtype.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/perf/aggregate.hpp"

namespace meshtest::bench {

/// What trace_vs_eager runs.
struct TraceVsEagerOptions {
  GptOssConfig config = {};   ///< the attention shapes (default: gpt-oss 20b/120b attention)
  std::int64_t tokens = 128;  ///< prefill length T
  std::int64_t tp = 1;        ///< heads per device = heads / tp (a TP device's share)
  std::int64_t layer = 0;     ///< the layer whose sliding window sdpa_sinks applies
  DType dtype = DType::bf16;  ///< f32, f64 or bf16
  int warmup = 3;             ///< unprofiled-region calls before the measured ones
  int iterations = 10;        ///< measured calls (N), between one start/stop signpost pair
  bool print = true;          ///< print the two aggregates and the ratios
};

/// The two aggregates and their ratios (replay / eager).
struct TraceVsEager {
  perf::Aggregate eager;     ///< qkv_rope + sdpa_sinks called eagerly
  perf::Aggregate replay;    ///< the same two ops replayed from one perf::Trace capture
  double kernel_ratio = 0;   ///< replay.total_kernel_duration_us / eager's
  double latency_ratio = 0;  ///< replay.total_op_to_op_latency_us / eager's (0 when eager's is 0)
};

/// On this process (one device, no MPI): random x [T, hidden], qkv weight and bias of
/// heads/tp q heads and kv_heads/tp kv heads, sinks; then, with the profiler on, `warmup` and
/// then `iterations` calls of qkv_rope -> sdpa_sinks (position offset 0, the layer's sliding
/// window), the measured ones between signpost("start") and ("stop"), aggregated with
/// perf::aggregate ({.iterations = N}); first eagerly, then by replaying one capture (inputs
/// and outputs in the trace). Checks that the last replay's output equals the last eager
/// call's bit for bit. Prints, when o.print: per mode "total_kernel_duration_us X
/// total_op_to_op_latency_us Y" and the replay/eager ratios. Nothing about time is asserted.
/// Throws Error for tokens, tp, warmup or iterations out of range (tokens, tp, iterations
/// >= 1, warmup >= 0), heads or kv heads not divisible by tp, a bad config (validate()), a
/// dtype qkv_rope does not take, or a replay that differs from the eager call.
TraceVsEager trace_vs_eager(const TraceVsEagerOptions& o = {});

}  // namespace meshtest::bench
