// The demo's perf helper: profiles a step on every device of the mesh with the shared
// aggregator, prints the per-op table and the e2e time, and writes reports/<name>/.
#pragma once

#include <functional>
#include <string>

#include "dist/mesh/mesh_device.hpp"
#include "dist/perf/e2e.hpp"

namespace meshtest::dist {

struct ProfileOptions {
  int warmup = 2;       ///< profiled iterations before the measured ones (not aggregated)
  int iterations = 10;  ///< measured iterations, each between a "start" and a "stop" signpost
  E2eOptions e2e = {};  ///< the end-to-end timing (profiling off)
};

/// Collective over the whole mesh; `step` must run the same ops and CCLs on every device.
/// Times `step` end to end with profiling off (dist::time_e2e), then runs it opts.warmup +
/// opts.iterations times under a perf::Session, each measured iteration after a barrier and
/// between "start" and "stop" signposts. Device 0 gathers every device's records
/// (dist::gather_records), aggregates them (compute ops: the slowest device; CCLs: the mean
/// over devices; then the average over iterations), writes reports/<name>/ (perf::write_report:
/// ops_perf_<name>.csv, measurements.json, trace.json, ops.png) and prints the per-op table,
/// the totals, the e2e time and the files written. Throws Error (on device 0) when the devices'
/// op sequences differ.
void profile_section(const MeshDevice& mesh, const std::string& name,
                     const std::function<void()>& step, const ProfileOptions& opts = {});

}  // namespace meshtest::dist
