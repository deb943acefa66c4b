// The demo's perf helper (tools/demo_perf.hpp): profile a step on every device, aggregate the
// mesh-device way, print the table and write reports/<name>/.
#include "tools/demo_perf.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <vector>

#include "dist/mesh/mpi_check.hpp"
#include "dist/perf/gather.hpp"
#include "src/perf/measurements.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/report.hpp"

namespace meshtest::dist {

void profile_section(const MeshDevice& mesh, const std::string& name,
                     const std::function<void()>& step, const ProfileOptions& opts) {
  const perf::E2eStats e2e = time_e2e(mesh, step, opts.e2e);

  perf::set_device_id(mesh.device_id());
  std::vector<perf::OpRecord> records;
  {
    perf::Session session;
    for (int it = 0; it < opts.warmup + opts.iterations; ++it) {
      const bool measured = it >= opts.warmup;
      MESHTEST_MPI(MPI_Barrier(mesh.comm()));
      if (measured) perf::signpost("start");
      step();
      if (measured) perf::signpost("stop");
    }
    records = gather_records(mesh, perf::records());
  }
  if (mesh.device_id() != 0) return;
  const perf::ReportFiles f = perf::write_report(
      records, {.name = name, .aggregate = {.devices = mesh.size()}, .e2e = e2e});
  fmt::print(
      "\nper-op perf on mesh {} ({} devices): {} warm-up + {} measured iterations, each after a "
      "barrier and between start/stop signposts; per op: compute = slowest device, ccl = mean "
      "over devices, then the average over iterations\n\n{}",
      mesh.str(), mesh.size(), opts.warmup, opts.iterations, perf::summary_table(f.aggregate));
  fmt::print(
      "e2e per step (profiling off, {} warm-up, {} measured, slowest device): mean {:.1f} us, "
      "min {:.1f}, max {:.1f}, std {:.1f}\n",
      e2e.warmup, e2e.iterations, e2e.mean_us, e2e.min_us, e2e.max_us, e2e.std_us);
  fmt::print("reports: {}, {}, {}{}\n", f.csv.string(), f.measurements.string(), f.trace.string(),
             f.plot.empty() ? fmt::format(" ({})", f.plot_note) : ", " + f.plot.string());
}

}  // namespace meshtest::dist
