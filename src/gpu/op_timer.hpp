// op_timer: an op's device time on a CUDA stream for the profiler (src/perf/profiler.hpp), from
// CUDA events that nothing waits for until the records are read.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "src/perf/profiler.hpp"

namespace meshtest::gpu {

/// Times `scope`'s op on `stream` (of the current device) with CUDA events instead of the host
/// clock: one event is recorded on the stream now, one when the scope closes, and neither is
/// waited for until perf::records() reads them, so timing does not serialize the stream: the
/// host runs ahead while the op runs. The record's end - start is the time the stream spent from
/// the first event to the second (the op's kernels and copies, and any wait for earlier work
/// queued on the stream); its start is placed on the host's steady clock through an anchor event
/// recorded once per device on the legacy default stream, so that consecutive GPU ops give their
/// op-to-op latency (placement against host-timed records is good to the anchor's few
/// microseconds). Nothing when the scope is not recording (the profiler off, or inside a fused
/// op). Call it last before queueing the op's work, after giving the scope its inputs and
/// attributes: on an idle stream the start event completes at once, so host work between it and
/// the launch would count as the op's time. Events come from a pool per device; when it runs
/// dry, finished timers are read early and their events reused, so a long profiled run does not
/// create two events per op.
void time_on_stream(perf::OpScope& scope, cudaStream_t stream);

/// How many events the timers of `device` have created so far (the pool's size; diagnostics).
std::size_t timer_events_created(int device);

}  // namespace meshtest::gpu
