// meshtest-bench ccl: the nccl-tests table of meshtest's CCLs, each beside the direct MPI call
// timed in the same run on the same buffers, and the α-β model fitted to the measurements.
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/alpha_beta.hpp"
#include "bench/bench_common.hpp"
#include "dist/ccl/ccl.hpp"
#include "dist/ccl/detail.hpp"
#include "dist/ccl/malloc_tuning.hpp"
#include "dist/mesh/environment.hpp"
#include "src/core/file.hpp"
#include "tools/subcommand.hpp"

namespace meshtest::bench {
namespace {

namespace po = boost::program_options;
using dist::MeshDevice;
using dist::ReduceOp;

enum class Op { all_reduce, all_gather, reduce_scatter, all_to_all };
constexpr Op kOps[] = {Op::all_reduce, Op::all_gather, Op::reduce_scatter, Op::all_to_all};

/// What the bench needs to know of one CCL: names, bandwidth factor, α-β regressors.
struct OpInfo {
  std::string_view name, mpi_name;
  double (*bus_factor)(int);
  int ring_passes;  ///< ring all_reduce = reduce_scatter + all_gather: 2 passes; others 1
};

OpInfo info(Op op) {
  switch (op) {
    case Op::all_reduce:
      return {"all_reduce", "MPI_Allreduce", &dist::all_reduce_bw::bus_factor, 2};
    case Op::all_gather:
      return {"all_gather", "MPI_Allgather", &dist::all_gather_bw::bus_factor, 1};
    case Op::reduce_scatter:
      return {"reduce_scatter", "MPI_Reduce_scatter_block", &dist::reduce_scatter_bw::bus_factor,
              1};
    case Op::all_to_all:
      return {"all_to_all", "MPI_Alltoall", &dist::all_to_all_bw::bus_factor, 1};
  }
  return {};
}

struct Options {
  std::int64_t min_bytes = 0, max_bytes = 0;
  double factor = 2;
  int iters = 20, warmup = 5, check = 1, dim = 0, rows = 64, rounds = 3;
  DType dtype = DType::f32;
  ReduceOp redop = ReduceOp::sum;
  std::vector<Op> ops;
  std::string json;
};

/// One table row.
struct Row {
  Op op;
  std::int64_t bytes = 0, count = 0, wrong = 0;
  double time_us = 0, algbw = 0, busbw = 0, mpi_time_us = 0, mpi_busbw = 0, ratio = 0;
};

/// "64K", "32M", "1G", "4096" -> bytes.
/// The largest -b / -e: 2 GiB keeps every tensor's element count (bytes / element size, at
/// least 2 bytes an element) within MPI's int count limit.
constexpr std::int64_t kMaxBytes = std::int64_t{1} << 31;

std::int64_t parse_bytes(const std::string& s, std::string_view opt) {
  std::size_t used = 0;
  double v = -1;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
  }
  std::int64_t unit = 1;
  const std::string rest = s.substr(std::min(used, s.size()));
  if (rest == "K" || rest == "k") unit = 1 << 10;
  if (rest == "M" || rest == "m") unit = 1 << 20;
  if (rest == "G" || rest == "g") unit = 1 << 30;
  MESHTEST_CHECK(v > 0 && (rest.empty() || unit > 1),
                 "{}: expected a positive byte count such as 4096, 64K, 32M or 1G; got '{}'", opt,
                 s);
  const double bytes = v * static_cast<double>(unit);
  MESHTEST_CHECK(bytes <= static_cast<double>(kMaxBytes),
                 "{}: at most 2G ({} bytes), so that every element count fits MPI's int; got '{}'",
                 opt, kMaxBytes, s);
  return static_cast<std::int64_t>(bytes);
}

/// nccl-tests dtype names (float, double, bfloat16, int32, int64) and meshtest's (f32, ...).
DType parse_dtype(const std::string& s) {
  if (s == "float") return DType::f32;
  if (s == "double") return DType::f64;
  if (s == "bfloat16") return DType::bf16;
  if (s == "int32" || s == "int") return DType::i32;
  if (s == "int64") return DType::i64;
  const DType t = dtype_from_name(s);
  MESHTEST_CHECK(t != DType::u8, "-d: u8 holds packed formats and cannot be reduced");
  return t;
}

ReduceOp parse_redop(const std::string& s) {
  for (ReduceOp r : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg}) {
    if (dist::reduce_op_name(r) == s) return r;
  }
  fail("-o: unknown reduce op '{}' (expected sum, max, min or avg)", s);
}

std::vector<Op> parse_ops(const std::string& s) {
  std::vector<Op> out;
  std::stringstream in(s);
  for (std::string name; std::getline(in, name, ',');) {
    if (name == "all") return {std::begin(kOps), std::end(kOps)};
    const auto it = std::ranges::find_if(kOps, [&](Op o) { return info(o).name == name; });
    MESHTEST_CHECK(it != std::end(kOps),
                   "--op: unknown op '{}' (expected all_reduce, all_gather, reduce_scatter, "
                   "all_to_all or all)",
                   name);
    out.push_back(*it);
  }
  MESHTEST_CHECK(!out.empty(), "--op: no op given");
  return out;
}

// ------------------------------------------------------------------- crafted exact data

// Element (row, col) of device j's input [R, C]: (j + 1) * k with k = (row*C + col) % 7 + 1.
// Every reduction over j is then k times a small integer: exact in every dtype (bf16 too).
double input_value(int j, std::int64_t row, std::int64_t col, std::int64_t cols) {
  return (j + 1) * static_cast<double>((row * cols + col) % 7 + 1);
}

/// The reduction over p devices of (j + 1) * k, divided by k.
double reduced_factor(ReduceOp op, int p) {
  switch (op) {
    case ReduceOp::sum:
      return p * (p + 1) / 2.0;
    case ReduceOp::max:
      return p;
    case ReduceOp::min:
      return 1;
    case ReduceOp::avg:
      return (p + 1) / 2.0;
  }
  return 0;
}

/// The layout of one size: every tensor is [rows, cols] (1-D [cols] along dim 0); the op
/// splits or concatenates the last dim, whose local block has `block` columns.
struct Layout {
  std::int64_t rows = 1, cols = 0, block = 0;  // cols: of the whole (gathered / reduced) tensor
  Shape shape(std::int64_t c) const { return rows == 1 ? Shape{c} : Shape{rows, c}; }
};

Tensor make_input(const Layout& l, Op op, int me, DType t) {
  const std::int64_t c = op == Op::all_gather ? l.block : l.cols;
  Tensor x(l.shape(c), t);
  visit_dtype(t, [&]<class T>(type_tag<T>) {
    T* v = x.data<T>();
    for (std::int64_t r = 0; r < l.rows; ++r) {
      for (std::int64_t k = 0; k < c; ++k) v[r * c + k] = static_cast<T>(input_value(me, r, k, c));
    }
  });
  return x;
}

/// Elements of y (this device's output) that differ from the exactly predicted result.
std::int64_t count_wrong(const Layout& l, Op op, const Options& o, int me, int p, const Tensor& y) {
  const std::int64_t oc = op == Op::reduce_scatter ? l.block : l.cols;
  if (!(y.shape() == l.shape(oc)) || y.dtype() != o.dtype)
    return std::max<std::int64_t>(1, y.numel());
  const double f = reduced_factor(o.redop, p);
  std::int64_t wrong = 0;
  for (std::int64_t r = 0; r < l.rows; ++r) {
    for (std::int64_t k = 0; k < oc; ++k) {
      const std::int64_t j = k / l.block, kk = k % l.block;
      double want = 0;
      switch (op) {
        case Op::all_reduce:
          want = f * input_value(0, r, k, l.cols);
          break;
        case Op::all_gather:
          want = input_value(static_cast<int>(j), r, kk, l.block);
          break;
        case Op::reduce_scatter:
          want = f * input_value(0, r, me * l.block + k, l.cols);
          break;
        case Op::all_to_all:
          want = input_value(static_cast<int>(j), r, me * l.block + kk, l.cols);
          break;
      }
      wrong += y.item(r * oc + k) != want ? 1 : 0;
    }
  }
  return wrong;
}

// ------------------------------------------------------------------------- measuring

Tensor run_meshtest(const MeshDevice& mesh, Op op, const Tensor& x, const Options& o) {
  const int d = x.rank() - 1;
  switch (op) {
    case Op::all_reduce:
      return dist::all_reduce(mesh, x, {.op = o.redop});
    case Op::all_gather:
      return dist::all_gather(mesh, x, {.dim = d});
    case Op::reduce_scatter:
      return dist::reduce_scatter(mesh, x, {.dim = d, .op = o.redop});
    case Op::all_to_all:
      return dist::all_to_all(mesh, x, {.split_dim = d, .concat_dim = d});
  }
  return {};
}

/// The direct MPI call on the same bytes: x contiguous in, `out` contiguous out.
void run_mpi(MPI_Comm comm, Op op, const Tensor& x, Tensor& out, const Options& o, int p) {
  const MPI_Datatype t = dist::detail::mpi_type(x.dtype());
  const auto n = static_cast<int>(x.numel());
  switch (op) {
    case Op::all_reduce:
      MESHTEST_MPI(MPI_Allreduce(x.bytes(), out.bytes(), n, t,
                                 dist::detail::mpi_op(o.redop, x.dtype()), comm));
      return;
    case Op::all_gather:
      MESHTEST_MPI(MPI_Allgather(x.bytes(), n, t, out.bytes(), n, t, comm));
      return;
    case Op::reduce_scatter:
      MESHTEST_MPI(MPI_Reduce_scatter_block(x.bytes(), out.bytes(), n / p, t,
                                            dist::detail::mpi_op(o.redop, x.dtype()), comm));
      return;
    case Op::all_to_all:
      MESHTEST_MPI(MPI_Alltoall(x.bytes(), n / p, t, out.bytes(), n / p, t, comm));
      return;
  }
}

Row measure(const MeshDevice& mesh, Op op, std::int64_t bytes, const Options& o) {
  const int p = mesh.size(), me = mesh.device_id();
  const auto e = static_cast<std::int64_t>(dtype_size(o.dtype));
  const std::int64_t unit = (o.dim == 0 ? 1 : o.rows) * (op == Op::all_reduce ? 1 : p);
  const std::int64_t n = std::max<std::int64_t>(1, bytes / e / unit) * unit;
  Layout l{.rows = o.dim == 0 ? 1 : o.rows, .cols = 0, .block = 0};
  l.cols = n / l.rows;
  l.block = op == Op::all_reduce ? l.cols : l.cols / p;
  const Tensor x = make_input(l, op, me, o.dtype);
  Tensor mpi_out(l.shape(op == Op::reduce_scatter ? l.block : l.cols), o.dtype);
  // Each output lives for one iteration, as in a loop body that uses it and moves on.
  auto ours = [&] { (void)run_meshtest(mesh, op, x, o); };
  auto theirs = [&] { run_mpi(mesh.comm(), op, x, mpi_out, o, p); };
  for (int i = 0; i < o.warmup; ++i) ours(), theirs();
  // Alternate short windows of both and keep each one's best window: noise from other
  // processes on the machine then hits both alike. A window is at most kWindow seconds (at
  // least one call); the calls in all windows add up to rounds * iters for each side.
  constexpr double kWindow = 2e-3;
  const double est = time_per_call(mesh.comm(), 1, theirs);
  const int per = std::clamp(static_cast<int>(kWindow / std::max(est, 1e-9)), 1, o.iters);
  const int windows = (o.rounds * o.iters + per - 1) / per;
  double t = 1e30, t_mpi = 1e30;
  for (int w = 0; w < windows; ++w) {
    t = std::min(t, time_per_call(mesh.comm(), per, ours));
    t_mpi = std::min(t_mpi, time_per_call(mesh.comm(), per, theirs));
  }
  Row row{.op = op, .bytes = n * e, .count = op == Op::all_reduce ? n : n / p};
  if (o.check) {
    const std::int64_t mine = count_wrong(l, op, o, me, p, run_meshtest(mesh, op, x, o));
    MESHTEST_MPI(MPI_Allreduce(&mine, &row.wrong, 1, MPI_INT64_T, MPI_SUM, mesh.comm()));
  } else {
    row.wrong = -1;
  }
  const double f = info(op).bus_factor(p), s = static_cast<double>(row.bytes);
  row.time_us = t * 1e6;
  row.algbw = s / t / 1e9;
  row.busbw = row.algbw * f;
  row.mpi_time_us = t_mpi * 1e6;
  row.mpi_busbw = s / t_mpi / 1e9 * f;
  row.ratio = t_mpi / t;  // = busbw / mpi_busbw (same bytes, same factor), defined at np 1 too
  return row;
}

// -------------------------------------------------------------------------- printing

std::string human(double bytes) {
  if (bytes >= 1 << 20) return fmt::format("{:g} MiB", bytes / (1 << 20));
  if (bytes >= 1 << 10) return fmt::format("{:g} KiB", bytes / (1 << 10));
  return fmt::format("{:g} B", bytes);
}

void print_header(const Options& o, Op op, int p) {
  fmt::print(
      "#\n# {} vs {} — np {}, dim {}, redop {}, {} warm-up, then {} x {} calls each in "
      "alternating windows of <= 2 ms; time = best window's average (max over ranks)\n"
      "# ratio = meshtest busbw / MPI busbw = MPI time / meshtest time (1.00 = as fast as MPI)\n"
      "#{:>12} {:>12} {:>6} {:>10} {:>8} {:>8} {:>7}   {:>10} {:>8} {:>6}\n"
      "#{:>12} {:>12} {:>6} {:>10} {:>8} {:>8} {:>7}   {:>10} {:>8} {:>6}\n",
      info(op).name, info(op).mpi_name, p, o.dim, dist::reduce_op_name(o.redop), o.warmup, o.rounds,
      o.iters, "size", "count", "type", "time", "algbw", "busbw", "#wrong", "mpi time", "mpi bus",
      "ratio", "(B)", "(elements)", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "");
}

void print_row(const Row& r, DType t) {
  fmt::print(
      " {:>12} {:>12} {:>6} {:>10.1f} {:>8.3f} {:>8.3f} {:>7}   {:>10.1f} {:>8.3f} {:>6.2f}\n",
      r.bytes, r.count, dtype_name(t), r.time_us, r.algbw, r.busbw,
      r.wrong < 0 ? std::string("N/A") : std::to_string(r.wrong), r.mpi_time_us, r.mpi_busbw,
      r.ratio);
}

/// Fits t = α·passes·(p-1) + β·bus_factor(p)·S to the op's rows and prints the projection.
void print_model(Op op, int p, const std::vector<Row>& rows) {
  const OpInfo in = info(op);
  std::vector<AlphaBetaSample> s;
  for (const Row& r : rows) {
    s.push_back({.steps = in.ring_passes * (p - 1.0),
                 .bytes_term = in.bus_factor(p) * static_cast<double>(r.bytes),
                 .seconds = r.time_us * 1e-6});
  }
  if (p < 2 || s.size() < 2) {
    fmt::print("# α-β model of {}: needs np >= 2 and two sizes or more\n", in.name);
    return;
  }
  const AlphaBeta m = fit_alpha_beta(s);
  fmt::print(
      "# α-β model of {} (ring): t = α·{}(p-1) + β·busfactor(p)·S, fitted on np {} "
      "(relative least squares over {} sizes, rms error {:.1f} %):\n"
      "#   α = {:.2f} us per step, 1/β = {:.3f} GB/s\n#   projected time (us):\n#{:>7}",
      in.name, in.ring_passes == 1 ? "" : "2", p, s.size(), 100 * m.rel_rms, m.alpha * 1e6,
      1e-9 / m.beta, "ranks");
  std::vector<double> sizes{static_cast<double>(rows.front().bytes)};
  if (rows.size() > 2) sizes.push_back(static_cast<double>(rows[rows.size() / 2].bytes));
  if (rows.size() > 1) sizes.push_back(static_cast<double>(rows.back().bytes));
  for (double b : sizes) fmt::print(" {:>14}", human(b));
  fmt::print("\n");
  for (int q = 16; q <= 1024; q *= 2) {
    fmt::print("#{:>7}", q);
    for (double b : sizes) {
      fmt::print(" {:>14.1f}", 1e6 * m.predict(in.ring_passes * (q - 1.0), in.bus_factor(q) * b));
    }
    fmt::print("\n");
  }
}

nlohmann::json to_json(const Row& r, const Options& o, int p) {
  return {{"op", info(r.op).name},
          {"bytes", r.bytes},
          {"dtype", dtype_name(o.dtype)},
          {"np", p},
          {"dim", o.dim},
          {"time_us", r.time_us},
          {"algbw", r.algbw},
          {"busbw", r.busbw},
          {"wrong", r.wrong},
          {"mpi_time_us", r.mpi_time_us},
          {"mpi_busbw", r.mpi_busbw},
          {"ratio", r.ratio}};
}

// ------------------------------------------------------------------------------ main

/// Parses argv into o; returns 0 to go on, 1 after --help, 2 on bad input (message printed).
int parse(int argc, char** argv, Options& o) {
  std::string b = "64K", e = "32M", d = "float", redop = "sum", ops = "all";
  po::options_description desc(
      "meshtest-bench ccl: the nccl-tests table (size count type time algbw busbw #wrong) of "
      "meshtest's all_reduce, all_gather, reduce_scatter and all_to_all, each beside the direct "
      "MPI call (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoall) timed in "
      "the same run on the same buffers, and the α-β model projected to 16..1024 ranks.\n"
      "Run as: ./launch/meshtest bench ccl -np N [options]\nOptions");
  desc.add_options()("help,h", "this help")("minbytes,b", po::value(&b)->default_value(b),
                                            "smallest message size (bytes; K, M, G)")(
      "maxbytes,e", po::value(&e)->default_value(e), "largest message size")(
      "stepfactor,f", po::value(&o.factor)->default_value(2), "size multiplier between rows")(
      "iters,n", po::value(&o.iters)->default_value(20), "timed iterations per round")(
      "warmup_iters,w", po::value(&o.warmup)->default_value(5), "untimed warm-up iterations")(
      "check,c", po::value(&o.check)->default_value(1), "verify results exactly (0/1)")(
      "datatype,d", po::value(&d)->default_value(d), "float, double, bfloat16, int32, int64")(
      "redop,o", po::value(&redop)->default_value(redop), "reduce op: sum, max, min, avg")(
      "op", po::value(&ops)->default_value(ops),
      "CCLs, comma-separated: all_reduce, all_gather, reduce_scatter, all_to_all, or all")(
      "dim", po::value(&o.dim)->default_value(0),
      "0: 1-D tensors; 1: [rows, p*k] tensors split or gathered along dim 1 (a non-leading "
      "dim) against the direct MPI call on the same bytes")(
      "rows", po::value(&o.rows)->default_value(64), "rows of the 2-D tensors of --dim 1")(
      "rounds", po::value(&o.rounds)->default_value(3),
      "rounds of -n calls per side, timed in alternating windows of at most 2 ms (at least "
      "one call) of meshtest and MPI; each side keeps its best window")(
      "json", po::value(&o.json), "write the rows to this JSON file (rank 0)");
  return parse_options("ccl", argc, argv, desc, [&] {
    o.min_bytes = parse_bytes(b, "-b");
    o.max_bytes = parse_bytes(e, "-e");
    o.dtype = parse_dtype(d);
    o.redop = parse_redop(redop);
    o.ops = parse_ops(ops);
    MESHTEST_CHECK(o.min_bytes <= o.max_bytes, "-b {} is larger than -e {}", b, e);
    MESHTEST_CHECK(o.factor > 1 || o.min_bytes == o.max_bytes,
                   "-f must be > 1 (got {}) unless -b equals -e", o.factor);
    MESHTEST_CHECK(o.iters > 0 && o.warmup >= 0 && o.rounds > 0,
                   "-n and --rounds must be >= 1 and -w >= 0 (got {}, {}, {})", o.iters, o.rounds,
                   o.warmup);
    MESHTEST_CHECK(o.check == 0 || o.check == 1, "-c must be 0 or 1 (got {})", o.check);
    MESHTEST_CHECK(o.dim == 0 || o.dim == 1, "--dim must be 0 or 1 (got {})", o.dim);
    MESHTEST_CHECK(o.rows > 0, "--rows must be positive (got {})", o.rows);
    MESHTEST_CHECK(o.redop != ReduceOp::avg || is_floating(o.dtype),
                   "-o avg needs a floating dtype (got {})", o.dtype);
  });
}

int bench_ccl(int argc, char** argv) {
  Options o;
  // Before MPI: --help and bad options need no communication (every rank parses alike).
  if (const int rc = parse(argc, argv, o); rc != 0) return rc == 1 ? 0 : rc;
  dist::tune_malloc_for_collectives();  // before MPI allocates: see the header
  dist::Environment env(argc, argv);
  return run_or_abort("ccl", [&] {
    const MeshDevice mesh = MeshDevice::line();
    const int p = mesh.size();
    const bool root = mesh.device_id() == 0;
    nlohmann::json all = nlohmann::json::array();
    if (root) {
      fmt::print("# meshtest-bench ccl: np {}, dtype {}, sizes {} .. {} x{:g}\n", p, o.dtype,
                 human(static_cast<double>(o.min_bytes)), human(static_cast<double>(o.max_bytes)),
                 o.factor);
    }
    for (Op op : o.ops) {
      if (root) print_header(o, op, p);
      std::vector<Row> rows;
      for (double b = static_cast<double>(o.min_bytes);
           b <= static_cast<double>(o.max_bytes) * 1.0001;
           b = o.factor > 1 ? b * o.factor : 2 * b + 1) {
        rows.push_back(measure(mesh, op, static_cast<std::int64_t>(b), o));
        if (root) print_row(rows.back(), o.dtype), std::fflush(stdout);
        all.push_back(to_json(rows.back(), o, p));
      }
      if (root) print_model(op, p, rows);
    }
    if (root && !o.json.empty()) {
      const std::string text = all.dump(2) + "\n";
      const std::span<const std::byte> part = std::as_bytes(std::span(text));
      write_file_atomic(o.json, std::span(&part, 1));
      fmt::print("# wrote {} rows to {}\n", all.size(), o.json);
    }
    std::int64_t wrong = 0;
    for (const auto& r : all) wrong += std::max<std::int64_t>(0, r["wrong"].get<std::int64_t>());
    return wrong == 0 ? 0 : 1;
  });
}

const tools::RegisterSubcommand reg{
    {"ccl", "nccl-tests table of the CCLs against the direct MPI call, and the α-β model",
     &bench_ccl}};

}  // namespace
}  // namespace meshtest::bench
