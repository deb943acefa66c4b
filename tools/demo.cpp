// meshtest-demo: every CCL on every mesh axis, checked bit for bit against a single-device run.
#include <fmt/format.h>
#include <mpi.h>
#include <boost/program_options.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dist/ccl/cases.hpp"
#include "dist/ccl/malloc_tuning.hpp"
#include "dist/mesh/environment.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/check/compare.hpp"
#include "src/check/metrics.hpp"
#include "src/core/eigen_cache.hpp"
#include "tools/demo_sections.hpp"
#include "tools/mesh_arg.hpp"

namespace meshtest::dist {
namespace {

namespace po = boost::program_options;

/// Set once the devices start communicating: a later error may be one rank's alone, so it aborts
/// the job instead of leaving the other ranks waiting in a collective.
bool g_communicating = false;

/// Columns of every per-device input of the CCL rows: inputs are [rows, kCols].
constexpr std::int64_t kCols = 16;

/// A CCL row of the table (one per axis and dtype): a collective of dist/ccl/cases.hpp and its
/// options.
///   all_gather      dim 0               reduce_scatter  dim 0, sum
///   all_reduce      sum, then avg       all_to_all      split 0, concat 1
///   all_to_all_v    split 0, concat 0, uneven counts (send_count)
///   broadcast       root 0
struct Entry {
  CclOp op;
  ReduceOp reduce = ReduceOp::sum;
};
constexpr Entry kEntries[] = {{CclOp::all_gather}, {CclOp::reduce_scatter},
                              {CclOp::all_reduce}, {CclOp::all_reduce, ReduceOp::avg},
                              {CclOp::all_to_all}, {CclOp::all_to_all_v},
                              {CclOp::broadcast}};

/// "all_gather", "all_reduce(sum)", ...
std::string label(const Entry& e) {
  const std::string_view name = ccl_case(e.op).name;
  return e.op == CclOp::all_reduce ? fmt::format("{}({})", name, reduce_op_name(e.reduce))
                                   : std::string(name);
}

/// all_to_all_v: the rows device d sends axis index j of p (uneven, different on every device).
std::int64_t send_count(std::int64_t rows, int p, int d, int j) { return rows / p + (d + j) % 3; }

/// The entry's call on this device's group along `axis`: every input [rows, kCols], but
/// all_to_all_v's (send_count).
CclCall demo_call(const MeshDevice& m, const Entry& e, int axis, DType t, std::int64_t rows) {
  CclCall c{.op = e.op,
            .dtype = t,
            .reduce = e.reduce,
            .axis = axis,
            .devices = axis_group(m, axis, m.device_id()),
            .shape = {rows, kCols},
            .concat_dim = e.op == CclOp::all_to_all ? 1 : 0};
  if (e.op == CclOp::all_to_all_v) {
    for (int d : c.devices) {
      for (int j = 0; j < c.p(); ++j) c.counts.push_back(send_count(rows, c.p(), d, j));
    }
  }
  return c;
}

/// The global input: every device's rows stacked in device order, [sum_d rows_d, kCols].
Shape global_shape(const MeshDevice& m, const Entry& e, int axis, std::int64_t rows) {
  const int p = m.axis_size(axis);
  std::int64_t total = 0;
  for (int d = 0; d < m.size(); ++d) {
    if (e.op != CclOp::all_to_all_v) {
      total += rows;
      continue;
    }
    for (int j = 0; j < p; ++j) total += send_count(rows, p, d, j);
  }
  return {total, kCols};
}

/// One device's check of its result, sent to rank 0 as kVerdictDoubles doubles.
struct Verdict {
  double bad = 0;  ///< 1 when the result is not bit-equal to the reference
  double pcc = 1;
  double row = -1, col = -1;  ///< worst element (row, col of the 2-D result); -1: wrong shape
  double expected = 0, got = 0;
  double error() const { return std::abs(got - expected); }
};
constexpr int kVerdictDoubles = sizeof(Verdict) / sizeof(double);

/// Compares this device's result with the exact expected one; local.
Verdict check_local(const Tensor& ref, const Tensor& y) {
  if (!(ref.shape() == y.shape())) return {.bad = 1, .pcc = 0};
  const Comparison c = compare(ref, y, Metric::exact, 0);
  const std::int64_t cols = std::max<std::int64_t>(1, y.shape()[y.rank() - 1]);
  const std::int64_t row = c.worst_index / cols, col = c.worst_index % cols;
  return {.bad = c.passed ? 0.0 : 1.0,
          .pcc = pcc(ref, y),
          .row = c.passed ? -1.0 : static_cast<double>(row),
          .col = c.passed ? -1.0 : static_cast<double>(col),
          .expected = c.expected_at_worst,
          .got = c.got_at_worst};
}

/// A printed row of the table.
struct Row {
  std::string op, axis, global, local, dtype, check;
  double pcc = 1, median_us = 0;
  bool ok = true;
};

/// Fills row.check, row.ok and row.pcc (worst over devices) from every device's verdict.
void summarize(const std::vector<Verdict>& all, Row& row) {
  int failing = 0;
  const Verdict* worst = nullptr;
  for (const Verdict& v : all) {
    row.pcc = std::min(row.pcc, v.pcc);
    if (v.bad == 0) continue;
    ++failing;
    if (!worst || v.error() > worst->error()) worst = &v;
  }
  row.ok = failing == 0;
  if (row.ok) {
    row.check = "PASS exact";
    return;
  }
  const auto dev = worst - all.data();
  row.check =
      worst->row < 0
          ? fmt::format("FAIL {}/{} dev {} wrong shape", failing, all.size(), dev)
          : fmt::format("FAIL {}/{} dev {} at [{}, {}]: expected {}, got {}", failing, all.size(),
                        dev, worst->row, worst->col, worst->expected, worst->got);
}

/// Runs the entry on `axis` `warmup + iters` times, checks the last result on every device,
/// and returns the row (complete on rank 0 only). Collective over the whole mesh.
Row measure(const MeshDevice& m, const Entry& e, int axis, DType t, std::int64_t rows, int warmup,
            int iters) {
  const CclCase& cc = ccl_case(e.op);
  const CclCall call = demo_call(m, e, axis, t, rows);
  const int me = m.axis_index(axis);
  const Tensor x = cc.input(call, me);
  Tensor y;
  std::vector<double> secs;
  for (int it = 0; it < warmup + iters; ++it) {
    MESHTEST_MPI(MPI_Barrier(m.comm()));
    const double t0 = MPI_Wtime();
    y = cc.run(m, x, call);
    if (it >= warmup) secs.push_back(MPI_Wtime() - t0);
  }
  std::sort(secs.begin(), secs.end());
  const double median = secs[secs.size() / 2] * 1e6;
  Row row{.op = label(e),
          .axis = axis == kAllAxes ? "all" : std::to_string(axis),
          .global = global_shape(m, e, axis, rows).str(),
          .local = fmt::format("{} -> {}", x.shape(), y.shape()),
          .dtype = std::string(dtype_name(t)),
          .check = {}};
  MESHTEST_MPI(MPI_Reduce(&median, &row.median_us, 1, MPI_DOUBLE, MPI_MAX, 0, m.comm()));
  const Verdict mine = check_local(cc.expected(call, me), y);
  std::vector<Verdict> all(static_cast<std::size_t>(m.size()));
  MESHTEST_MPI(MPI_Gather(&mine, kVerdictDoubles, MPI_DOUBLE, all.data(), kVerdictDoubles,
                          MPI_DOUBLE, 0, m.comm()));
  if (m.device_id() == 0) summarize(all, row);
  return row;
}

std::vector<DType> parse_dtypes(const std::string& s) {
  std::vector<DType> out;
  std::stringstream in(s);
  for (std::string name; std::getline(in, name, ',');) {
    const DType t = dtype_from_name(name);
    MESHTEST_CHECK(t != DType::u8, "--dtypes: u8 holds packed formats and cannot be reduced");
    out.push_back(t);
  }
  MESHTEST_CHECK(!out.empty(), "--dtypes: no dtype given");
  return out;
}

int demo(int argc, char** argv, int rank, int np) {
  po::options_description opts(
      "meshtest-demo: every CCL on every mesh axis vs a single-device run");
  auto add = opts.add_options();
  add("help,h", "print this help");
  add("mesh", po::value<std::string>(),
      "mesh RxC (or N); R*C = mpirun -np. Default: 2 x np/2 for an even np >= 4 (2x4 at "
      "np 8), else 1 x np");
  add("size", po::value<std::int64_t>()->default_value(4096),
      "elements per device: each input is [size/16 + 1, 16] (uneven splits)");
  add("dtypes", po::value<std::string>()->default_value("f32,bf16"),
      "comma-separated list of f32, f64, bf16, f16, i32, i64");
  add("iters", po::value<int>()->default_value(20), "measured iterations per row");
  add("warmup", po::value<int>()->default_value(3), "warm-up iterations per row");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, opts), vm);
  po::notify(vm);
  if (vm.count("help")) {
    if (rank == 0) std::cout << opts << "\nRun as: mpirun -np 8 meshtest-demo --mesh 2x4\n";
    return 0;
  }
  const std::string mesh_arg = vm.count("mesh")         ? vm["mesh"].as<std::string>()
                               : np % 2 == 0 && np >= 4 ? fmt::format("2x{}", np / 2)
                                                        : fmt::format("1x{}", np);
  const std::array<int, 2> shape = tools::parse_mesh_arg(mesh_arg);
  const int devices = shape[0] * shape[1];
  MESHTEST_CHECK(devices == np,
                 "--mesh {} has {} devices but mpirun started {} ranks (run with -np {} or pass a "
                 "mesh of {} devices)",
                 mesh_arg, devices, np, devices, np);
  const std::int64_t size = vm["size"].as<std::int64_t>();
  const int iters = vm["iters"].as<int>(), warmup = vm["warmup"].as<int>();
  MESHTEST_CHECK(size >= 0 && iters >= 1 && warmup >= 0,
                 "--size must be >= 0, --iters >= 1 and --warmup >= 0; got {}, {}, {}", size, iters,
                 warmup);
  const std::vector<DType> dtypes = parse_dtypes(vm["dtypes"].as<std::string>());
  g_communicating = true;
  const MeshDevice mesh(std::vector<int>{shape[0], shape[1]});

  const double t0 = MPI_Wtime();
  std::vector<Row> rows;
  for (const Entry& e : kEntries) {
    for (int axis : {0, 1, kAllAxes}) {
      for (DType dt : dtypes) {
        if (e.reduce == ReduceOp::avg && !is_floating(dt)) continue;
        rows.push_back(measure(mesh, e, axis, dt, size / kCols + 1, warmup, iters));
      }
    }
  }
  // Verdicts are complete on rank 0; every rank returns its count so they all exit alike.
  int failed =
      static_cast<int>(std::count_if(rows.begin(), rows.end(), [](const Row& r) { return !r.ok; }));
  MESHTEST_MPI(MPI_Bcast(&failed, 1, MPI_INT, 0, mesh.comm()));
  if (rank == 0) {
    fmt::print(
        "meshtest demo: mesh {} ({} devices), {} elements per device, {} iterations; "
        "each result compared bit for bit with the same op on one device\n\n",
        mesh.str(), mesh.size(), size, iters);
    const auto line = [](auto&&... a) {
      fmt::print("{:<16} {:<4} {:<11} {:<24} {:<5} {:>9} {:>11}  {}\n", a...);
    };
    line("op", "axis", "global", "device in -> out", "dtype", "pcc", "median us", "check");
    for (const Row& r : rows) {
      line(r.op, r.axis, r.global, r.local, r.dtype, fmt::format("{:.6f}", r.pcc),
           fmt::format("{:.1f}", r.median_us), r.check);
    }
    fmt::print(
        "\n{} checks, {} passed, {} failed; time = median over iterations, max over "
        "devices; wall {:.1f} s\n",
        rows.size(), rows.size() - static_cast<std::size_t>(failed), failed, MPI_Wtime() - t0);
  }
  failed += demo_gpt_oss(mesh);
  failed += demo_dpsgd(mesh);
  failed += demo_moe(mesh);
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace meshtest::dist

int main(int argc, char** argv) {
  meshtest::dist::tune_malloc_for_collectives();  // opt-in: see the header
  meshtest::dist::Environment env(argc, argv);
  try {
    meshtest::apply_eigen_cache_env();
    return meshtest::dist::demo(argc, argv, env.rank(), env.size());
  } catch (const std::exception& e) {
    // Bad options fail the same way on every rank before any communication: rank 0 reports.
    if (!meshtest::dist::g_communicating) {
      if (env.rank() == 0) fmt::print(stderr, "meshtest-demo: error: {}\n", e.what());
      return 2;
    }
    fmt::print(stderr, "meshtest-demo: [rank {}] error: {}\n", env.rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
  }
}
