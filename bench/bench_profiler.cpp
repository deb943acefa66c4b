// meshtest-bench profiler: the per-op cost of perf::OpScope with profiling on and off, and a
// traced CCL sequence replayed against the same sequence run eagerly (time per sequence,
// kernel duration and op-to-op latency from the profiler's records).
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <boost/program_options.hpp>
#include <vector>

#include "bench/bench_common.hpp"
#include "dist/ccl/ccl.hpp"
#include "dist/ccl/ccl_log.hpp"
#include "dist/ccl/malloc_tuning.hpp"
#include "dist/mesh/environment.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/trace.hpp"
#include "tools/subcommand.hpp"

namespace meshtest::bench {
namespace bench_profiler {

namespace po = boost::program_options;
using dist::MeshDevice;

struct Options {
  int scope_iters = 200000, iters = 200, warmup = 20, rows = 8, cols = 64;
};

/// Nanoseconds per OpScope (opened, given an input, an attribute and an output, closed).
double scope_ns(const Tensor& x, int n) {
  const std::int64_t t0 = perf::now_ns();
  for (int i = 0; i < n; ++i) {
    perf::OpScope s("bench_op");
    s.input(x).attr("k", i).output(x);
  }
  return static_cast<double>(perf::now_ns() - t0) / n;
}

/// Nanoseconds per collective that the flight recorder adds: entering (ccl_log_enter), agreeing
/// (ccl_log_agreeing) and leaving (ccl_log_exit), as every CCL call does.
double flight_ns(const Tensor& x, int n) {
  const std::array<dist::LogField, 2> fields{dist::LogField{.key = "op", .text = "sum"},
                                             dist::LogField{.key = "axis", .text = "all"}};
  const std::int64_t t0 = perf::now_ns();
  for (int i = 0; i < n; ++i) {
    dist::ccl_log_enter("bench_ccl", x.shape(), x.dtype(), fields);
    dist::ccl_log_agreeing(0x1234, static_cast<std::uint64_t>(i));
    dist::ccl_log_exit();
  }
  return static_cast<double>(perf::now_ns() - t0) / n;
}

/// The measured sequence: four CCLs, each reading the previous output.
template <class Keep>
void sequence(const MeshDevice& mesh, const Tensor& x, Keep&& keep) {
  const Tensor& g = keep(dist::all_gather(mesh, x, {.dim = 1}));
  const Tensor& r = keep(dist::all_reduce(mesh, g));
  const Tensor& s = keep(dist::reduce_scatter(mesh, r, {.dim = 1}));
  keep(dist::all_to_all(mesh, s, {.split_dim = 1, .concat_dim = 1}));
}

/// Mean kernel duration and mean op-to-op latency (ns) of the ccl records of f() run `iters`
/// times with profiling on; gaps across sequences are left out. Slowest rank's means.
template <class F>
std::pair<double, double> record_means(MPI_Comm comm, int iters, F&& f) {
  const perf::Session session;
  for (int i = 0; i < iters; ++i) f(), perf::signpost("seq");
  double kernel = 0, gap = 0;
  int nk = 0, ng = 0;
  const std::vector<perf::OpRecord> rs = perf::records();
  for (std::size_t i = 0; i < rs.size(); ++i) {
    if (rs[i].op_type != perf::OpType::ccl) continue;
    kernel += static_cast<double>(rs[i].duration_ns()), ++nk;
    if (i > 0 && rs[i - 1].op_type == perf::OpType::ccl) {
      gap += static_cast<double>(rs[i].start_ns - rs[i - 1].end_ns), ++ng;
    }
  }
  std::array<double, 2> mine{kernel / std::max(nk, 1), gap / std::max(ng, 1)}, worst{};
  MESHTEST_MPI(MPI_Allreduce(mine.data(), worst.data(), 2, MPI_DOUBLE, MPI_MAX, comm));
  return {worst[0], worst[1]};
}

int parse(int argc, char** argv, Options& o) {
  po::options_description desc(
      "meshtest-bench profiler: the cost of perf::OpScope per op with profiling off and on "
      "(target <= 1 us), and trace replay against eager for a sequence of four CCLs "
      "(all_gather, all_reduce, reduce_scatter, all_to_all on [rows, cols] f32 per device).\n"
      "Run as: ./launch/meshtest bench profiler -np N [options]\nOptions");
  desc.add_options()("help,h", "this help")("scope-iters",
                                            po::value(&o.scope_iters)->default_value(o.scope_iters),
                                            "OpScope iterations per measurement")(
      "iters,n", po::value(&o.iters)->default_value(o.iters), "timed sequences")(
      "warmup_iters,w", po::value(&o.warmup)->default_value(o.warmup), "untimed sequences")(
      "rows", po::value(&o.rows)->default_value(o.rows), "rows of each device's input")(
      "cols", po::value(&o.cols)->default_value(o.cols), "columns of each device's input");
  return parse_options("profiler", argc, argv, desc, [&] {
    MESHTEST_CHECK(o.scope_iters > 0 && o.iters > 0 && o.warmup >= 0 && o.rows > 0 && o.cols > 0,
                   "--scope-iters, -n, --rows and --cols must be >= 1 and -w >= 0");
  });
}

/// The measurements and the replay check, after MPI_Init.
int profile(const Options& o) {
  const MeshDevice mesh = MeshDevice::line();
  const bool root = mesh.device_id() == 0;
  const MPI_Comm comm = mesh.comm();

  // 1. OpScope overhead (local; each rank measures, the slowest is printed).
  const Tensor small(Shape{4, 4}, DType::f32);
  double off = 1e30, on = 1e30;
  for (int round = 0; round < 3; ++round) {
    off = std::min(off, scope_ns(small, o.scope_iters));
    const perf::Session session;  // profiling on, records cleared afterwards
    on = std::min(on, scope_ns(small, o.scope_iters));
  }
  std::array<double, 2> mine{off, on}, worst{};
  MESHTEST_MPI(MPI_Allreduce(mine.data(), worst.data(), 2, MPI_DOUBLE, MPI_MAX, comm));
  if (root) {
    fmt::print(
        "# meshtest-bench profiler: np {}\n#\n# perf::OpScope per op (input, attribute, output; "
        "best of 3 rounds of {} ops, slowest rank)\n#{:>16} {:>12} {:>18}\n{:>17} {:>12.1f} "
        "{:>18.3f}\n{:>17} {:>12.1f} {:>18.3f}\n",
        mesh.size(), o.scope_iters, "profiling", "ns per op", "ratio to 1 us", "off", worst[0],
        worst[0] / 1000, "on", worst[1], worst[1] / 1000);
  }

  // 2. The flight recorder's cost per collective (target <= 0.2 us).
  double flight = 1e30;
  for (int round = 0; round < 3; ++round)
    flight = std::min(flight, flight_ns(small, o.scope_iters));
  double worst_flight = 0;
  MESHTEST_MPI(MPI_Allreduce(&flight, &worst_flight, 1, MPI_DOUBLE, MPI_MAX, comm));
  if (root) {
    fmt::print(
        "#\n# flight recorder per collective (enter, agreeing, exit; best of 3 rounds of {}, "
        "slowest rank)\n#{:>16} {:>12} {:>18}\n{:>17} {:>12.1f} {:>18.3f}\n",
        o.scope_iters, "", "ns per call", "ratio to 0.2 us", "recorder", worst_flight,
        worst_flight / 200);
  }

  // 3. Trace replay against eager.
  Tensor x0(Shape{o.rows, o.cols}, DType::f32);
  for (std::int64_t i = 0; i < x0.numel(); ++i) x0.data<float>()[i] = static_cast<float>(i % 13);
  perf::Trace trace;
  Tensor& x = trace.input(x0);
  std::vector<const Tensor*> kept;
  trace.capture([&] {
    sequence(mesh, x, [&](Tensor t) -> const Tensor& {
      return *kept.emplace_back(&trace.keep(std::move(t)));
    });
  });
  auto eager = [&] { sequence(mesh, x0, [](Tensor t) { return t; }); };
  auto replay = [&] { trace.replay(); };
  for (int i = 0; i < o.warmup; ++i) eager(), replay();
  double te = 1e30, tr = 1e30;
  for (int round = 0; round < 3; ++round) {
    te = std::min(te, time_per_call(comm, o.iters, eager));
    tr = std::min(tr, time_per_call(comm, o.iters, replay));
  }
  double ke = 1e30, ge = 1e30, kr = 1e30, gr = 1e30;
  for (int round = 0; round < 3; ++round) {
    const auto [k1, g1] = record_means(comm, o.iters, eager);
    const auto [k2, g2] = record_means(comm, o.iters, replay);
    ke = std::min(ke, k1), ge = std::min(ge, g1), kr = std::min(kr, k2), gr = std::min(gr, g2);
  }
  // Replay must give the eager result (checked on the last sequence, all ranks).
  std::vector<Tensor> want;
  sequence(mesh, x0, [&](Tensor t) -> const Tensor& { return want.emplace_back(std::move(t)); });
  trace.replay();
  int bad = 0, any = 0;
  for (std::size_t i = 0; i < want.size(); ++i) bad += kept[i]->bitwise_equal(want[i]) ? 0 : 1;
  MESHTEST_MPI(MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm));
  if (root) {
    fmt::print(
        "#\n# trace replay vs eager: {} CCLs per sequence on f32[{}, {}] per device, {} "
        "sequences, best of 3 rounds, slowest rank; replay == eager bit for bit: {}\n"
        "#{:>32} {:>12} {:>12} {:>14}\n",
        trace.size(), o.rows, o.cols, o.iters, any == 0 ? "yes" : "NO", "", "eager", "replay",
        "eager/replay");
    auto line = [](std::string_view what, double e, double r) {
      fmt::print(" {:>32} {:>12.2f} {:>12.2f} {:>14.2f}\n", what, e, r, e / r);
    };
    line("time per sequence (us)", te * 1e6, tr * 1e6);
    line("time per op (us)", te * 1e6 / 4, tr * 1e6 / 4);
    line("kernel duration per op (us)", ke / 1e3, kr / 1e3);
    line("op-to-op latency (us)", ge / 1e3, gr / 1e3);
  }
  return any == 0 ? 0 : 1;
}

int bench_profiler(int argc, char** argv) {
  Options o;
  if (const int rc = parse(argc, argv, o); rc != 0) return rc == 1 ? 0 : rc;
  dist::tune_malloc_for_collectives();  // before MPI allocates: see the header
  dist::Environment env(argc, argv);
  return run_or_abort("profiler", [&] { return profile(o); });
}

const tools::RegisterSubcommand reg{
    {"profiler", "OpScope overhead per op, and trace replay vs eager for a CCL sequence",
     &bench_profiler}};

}  // namespace bench_profiler
}  // namespace meshtest::bench
