// op_timer: an op's device time on a CUDA stream for the profiler (src/perf/profiler.hpp), from
// CUPTI's activity records of its kernels, or from CUDA events, that nothing waits for until the
// records are read.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <string>

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
///
/// With the CUPTI timer (gpu_timer()), the scope is CUPTI's external correlation while its work
/// is queued instead: the record spans its kernels', copies' and memsets' own start and end
/// (CUPTI's activity records, read when perf::records() is, after waiting for the device), not
/// the wait for earlier work on the stream, and costs no event; an op that queued no work
/// takes the host's times.
void time_on_stream(perf::OpScope& scope, cudaStream_t stream);

/// Where time_on_stream takes an op's device time from.
enum class GpuTimer { cupti, events };

/// The timer time_on_stream uses: MESHTEST_GPU_TIMER (cupti or events; unset: cupti), cupti
/// only where CUPTI's activity API starts (cupti_problem()), events otherwise. Starting CUPTI
/// (the first timed scope) enables its kernel, copy and memset records for the process: every
/// later launch pays CUPTI's cost, timed or not. A MESHTEST_GPU_TIMER other than cupti or
/// events is an Error naming it.
GpuTimer gpu_timer();

/// Why the CUPTI timer is not in use: "" when it is; else the reason (built without CUPTI,
/// MESHTEST_GPU_TIMER=events or set_gpu_timer, CUPTI's error, such as another profiler holding
/// it).
std::string cupti_problem();

/// Uses `timer` for the scopes timed from now on (cupti: where it starts, else events; events
/// turns CUPTI's records off again), or with std::nullopt lets MESHTEST_GPU_TIMER decide again;
/// for tests and benches that compare the two.
void set_gpu_timer(std::optional<GpuTimer> timer);

/// How many events the timers of `device` have created so far (the pool's size; diagnostics).
std::size_t timer_events_created(int device);

}  // namespace meshtest::gpu
