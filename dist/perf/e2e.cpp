// End-to-end timing over the mesh.
#include "dist/perf/e2e.hpp"

#include <vector>

#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist {

perf::E2eStats time_e2e(const MeshDevice& mesh, const std::function<void()>& fn,
                        const E2eOptions& opts) {
  MPI_Comm comm = mesh.comm();
  // Agree on the options first: max and -min of each value must match.
  int v[4] = {opts.warmup, opts.iterations, -opts.warmup, -opts.iterations};
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, v, 4, MPI_INT, MPI_MAX, comm));
  MESHTEST_DIST_CHECK(v[0] == -v[2] && v[1] == -v[3],
                      "time_e2e: warmup and iterations must be equal on every device; got "
                      "warmup {}, iterations {} here",
                      opts.warmup, opts.iterations);
  MESHTEST_DIST_CHECK(opts.warmup >= 0 && opts.iterations >= 1,
                      "time_e2e: need warmup >= 0 and iterations >= 1, got {} and {}", opts.warmup,
                      opts.iterations);
  std::vector<double> us(static_cast<std::size_t>(opts.iterations));
  for (int it = 0; it < opts.warmup + opts.iterations; ++it) {
    MESHTEST_MPI(MPI_Barrier(comm));
    const double t0 = MPI_Wtime();
    fn();
    if (it >= opts.warmup)
      us[static_cast<std::size_t>(it - opts.warmup)] = (MPI_Wtime() - t0) * 1e6;
  }
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, us.data(), opts.iterations, MPI_DOUBLE, MPI_MAX, comm));
  return perf::e2e_stats(us, opts.warmup);
}

}  // namespace meshtest::dist
