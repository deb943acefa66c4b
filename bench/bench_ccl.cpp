// meshtest-bench ccl: the nccl-tests table of meshtest's CCLs, each beside the direct MPI call
// timed in the same run on the same buffers, and the α-β model fitted to the measurements.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <boost/program_options.hpp>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_common.hpp"
#include "bench/ccl_bench.hpp"
#include "dist/ccl/arena/arena.hpp"
#include "dist/ccl/cases.hpp"
#include "dist/ccl/ccl.hpp"
#include "dist/ccl/malloc_tuning.hpp"
#include "dist/ccl/mpi_types.hpp"
#include "dist/ccl/path_registry.hpp"
#include "dist/mesh/environment.hpp"
#include "tools/subcommand.hpp"

namespace meshtest::bench::ccl {

namespace bench_ccl {

namespace po = boost::program_options;
using dist::MeshDevice;

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

/// nccl-tests dtype names (float, double, bfloat16, half, int32, int64) and meshtest's (f32, ...).
DType parse_dtype(const std::string& s) {
  if (s == "float") return DType::f32;
  if (s == "double") return DType::f64;
  if (s == "bfloat16") return DType::bf16;
  if (s == "half" || s == "float16") return DType::f16;
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

std::vector<CclOp> parse_ops(const std::string& s) {
  std::vector<CclOp> out;
  std::stringstream in(s);
  for (std::string name; std::getline(in, name, ',');) {
    if (name == "all") return {std::begin(kOps), std::end(kOps)};
    const auto it =
        std::ranges::find_if(kOps, [&](CclOp o) { return dist::ccl_case(o).name == name; });
    MESHTEST_CHECK(it != std::end(kOps),
                   "--op: unknown op '{}' (expected all_reduce, all_gather, reduce_scatter, "
                   "all_to_all or all)",
                   name);
    out.push_back(*it);
  }
  MESHTEST_CHECK(!out.empty(), "--op: no op given");
  return out;
}

// ------------------------------------------------------------------------- measuring

/// The traffic of the first host path that counts it on `comm` (the shared-memory path, once
/// the group has agreed a call: dist::path_reports).
std::optional<dist::PathTraffic> counted_traffic(MPI_Comm comm) {
  for (const dist::PathReport& r : dist::path_reports(comm)) {
    if (r.memory == dist::Memory::Kind::host && r.traffic) return r.traffic;
  }
  return std::nullopt;
}

/// The host paths that hold something for the bench's axis, in the order calls try them (a
/// call takes the first that takes it; MESHTEST_CCL_PATH chooses one).
void print_paths(MPI_Comm comm, int p) {
  fmt::print(
      "# meshtest's paths on the bench's axis (a line of {}), in the order calls try them:\n", p);
  if (p == 1) {
    fmt::print("#   none needed (one rank)\n");
    return;
  }
  for (const dist::PathReport& r : dist::path_reports(comm)) {
    if (r.memory == dist::Memory::Kind::host && !r.status.empty()) {
      fmt::print("#   {}: {}\n", r.name, r.status);
    }
  }
}

/// The direct MPI call on the same bytes: x contiguous in, `out` contiguous out.
void run_mpi(MPI_Comm comm, CclOp op, const Tensor& x, Tensor& out, const Options& o, int p) {
  const MPI_Datatype t = dist::mpi_type(x.dtype());
  const auto n = static_cast<int>(x.numel());
  switch (op) {
    case CclOp::all_reduce:
      MESHTEST_MPI(
          MPI_Allreduce(x.bytes(), out.bytes(), n, t, dist::mpi_op(o.redop, x.dtype()), comm));
      return;
    case CclOp::all_gather:
      MESHTEST_MPI(MPI_Allgather(x.bytes(), n, t, out.bytes(), n, t, comm));
      return;
    case CclOp::reduce_scatter:
      MESHTEST_MPI(MPI_Reduce_scatter_block(x.bytes(), out.bytes(), n / p, t,
                                            dist::mpi_op(o.redop, x.dtype()), comm));
      return;
    case CclOp::all_to_all:
      MESHTEST_MPI(MPI_Alltoall(x.bytes(), n / p, t, out.bytes(), n / p, t, comm));
      return;
    default:
      fail("meshtest-bench ccl: no direct MPI call for {}", dist::ccl_case(op).name);
  }
}

Row measure(const MeshDevice& mesh, CclOp op, std::int64_t bytes, const Options& o) {
  const int p = mesh.size(), me = mesh.device_id();
  const dist::CclCase& cc = dist::ccl_case(op);
  const auto e = static_cast<std::int64_t>(dtype_size(o.dtype));
  const Layout l = layout_of(op, bytes, o, p);
  const std::int64_t n = l.rows * l.cols;
  const dist::CclCall call = call_of(l, op, o, p);
  // With --memory arena the input lies in the node arena (read in place by the shared-memory
  // path; MPI reads the same buffer), and so does each call's output.
  const Tensor x = [&] {
    Tensor heap = cc.input(call, me);
    if (!o.arena) return heap;
    Tensor a(heap.shape(), heap.dtype(), *dist::NodeArena::get());
    if (heap.nbytes() > 0) std::memcpy(a.bytes(), heap.bytes(), heap.nbytes());
    return a;
  }();
  Tensor mpi_out(l.shape(op == CclOp::reduce_scatter ? l.block : l.cols), o.dtype);
  // Each output lives for one iteration, as in a loop body that uses it and moves on.
  auto ours = [&] { (void)cc.run(mesh, x, call); };
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
  Row row{.op = op, .bytes = n * e, .count = op == CclOp::all_reduce ? n : n / p};
  if (const std::optional<dist::PathTraffic> before = counted_traffic(mesh.comm())) {
    constexpr int kCounted = 3;
    for (int i = 0; i < kCounted; ++i) ours();
    const dist::PathTraffic after = counted_traffic(mesh.comm()).value_or(*before);
    // The busiest device's count (devices of one call differ by their parts' rounding).
    std::array<double, 3> v{static_cast<double>(after.steps - before->steps) / kCounted,
                            static_cast<double>(after.written - before->written) / kCounted,
                            static_cast<double>(after.read - before->read) / kCounted};
    MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, v.data(), 3, MPI_DOUBLE, MPI_MAX, mesh.comm()));
    // Nothing through the window (all_to_all of large blocks at many devices goes to MPI):
    // MPI's algorithm moves the bytes, uncounted here.
    row.counted = v[1] > 0 || v[2] > 0 || n == 0;
    row.steps = v[0], row.written = v[1], row.read = v[2];
  }
  if (o.check) {
    mpi_out = Tensor();  // room for the expected output
    const Tensor y = cc.run(mesh, x, call);
    const std::int64_t mine = dist::count_wrong(y, cc.expected(call, me));
    MESHTEST_MPI(MPI_Allreduce(&mine, &row.wrong, 1, MPI_INT64_T, MPI_SUM, mesh.comm()));
  } else {
    row.wrong = -1;
  }
  const double f = cc.bus_factor(p), s = static_cast<double>(row.bytes);
  row.time_us = t * 1e6;
  row.algbw = s / t / 1e9;
  row.busbw = row.algbw * f;
  row.mpi_time_us = t_mpi * 1e6;
  row.mpi_busbw = s / t_mpi / 1e9 * f;
  row.ratio = t_mpi / t;  // = busbw / mpi_busbw (same bytes, same factor), defined at np 1 too
  row.ring_min = f * s;
  return row;
}

/// memcpy bandwidth of `bytes` between two buffers, every rank copying at once (the contention
/// the CCL meets): bytes / the best time of one copy, the slowest rank's, in GB/s.
double memcpy_gbps(const MeshDevice& mesh, std::int64_t bytes) {
  std::vector<std::byte> a(static_cast<std::size_t>(bytes), std::byte{1});
  std::vector<std::byte> b(a.size(), std::byte{2});
  const auto copy = [&] { std::memcpy(b.data(), a.data(), a.size()); };
  for (int w = 0; w < 3; ++w) copy();  // warm: the first copies of a process run slow
  const double est = time_per_call(mesh.comm(), 1, copy);
  const int per = std::clamp(static_cast<int>(2e-3 / std::max(est, 1e-9)), 1, 10000);
  double t = 1e30;
  for (int w = 0; w < 5; ++w) t = std::min(t, time_per_call(mesh.comm(), per, copy));
  return static_cast<double>(bytes) / t / 1e9;
}

// ------------------------------------------------------------------------------ main

/// Whether this meshtest-bench has the GPU side (bench/CMakeLists.txt: ccl_cuda.cpp is built).
constexpr bool kWithCuda = MESHTEST_BENCH_CUDA != 0;

Device parse_device(const std::string& s) {
  MESHTEST_CHECK(s == "cpu" || s == "cuda", "--device: '{}' is not cpu or cuda", s);
  MESHTEST_CHECK(s == "cpu" || kWithCuda,
                 "--device cuda: this meshtest-bench was built without the GPU side (configure "
                 "with -DMESHTEST_CUDA=ON, or ./launch/meshtest build --cuda; docs/gpu.md)");
  return s == "cuda" ? Device::cuda : Device::cpu;
}

/// Parses argv into o; returns 0 to go on, 1 after --help, 2 on bad input (message printed).
int parse(int argc, char** argv, Options& o) {
  std::string device = "cpu", b, e, d = "float", redop = "sum", ops = "all", memory = "heap";
  po::options_description desc(
      "meshtest-bench ccl: the nccl-tests table (size count type time algbw busbw #wrong) of "
      "meshtest's all_reduce, all_gather, reduce_scatter and all_to_all, each beside the direct "
      "MPI call (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoall) timed in "
      "the same run on the same buffers, and the α-β model projected to 16..1024 ranks.\n"
      "--device cuda (a build with the GPU side): on each rank's GPU, meshtest's default (exact) "
      "path and its NCCL path (reductions) beside the direct NCCL call (ncclAllReduce, "
      "ncclAllGather, ncclReduceScatter, grouped ncclSend/ncclRecv) on the same communicator, "
      "stream and buffers, timed by CUDA events.\n"
      "Run as: ./launch/meshtest bench ccl -np N [options]\n"
      "    or: mpirun -np N -x NCCL_NVLS_ENABLE build/bin/meshtest-bench ccl --device cuda\n"
      "Options");
  desc.add_options()("help,h", "this help")(
      "device", po::value(&device)->default_value(device),
      "cpu: host tensors against MPI; cuda: each rank's GPU against NCCL (docs/ccl-bench.md)")(
      "minbytes,b", po::value(&b),
      "smallest message size (bytes; K, M, G); default 64K, with --device cuda 8")(
      "maxbytes,e", po::value(&e), "largest message size; default 32M, with --device cuda 1G")(
      "stepfactor,f", po::value(&o.factor)->default_value(2), "size multiplier between rows")(
      "iters,n", po::value(&o.iters)->default_value(20), "timed iterations per round")(
      "warmup_iters,w", po::value(&o.warmup)->default_value(5), "untimed warm-up iterations")(
      "check,c", po::value(&o.check)->default_value(1), "verify results exactly (0/1)")(
      "datatype,d", po::value(&d)->default_value(d), "float, double, bfloat16, half, int32, int64")(
      "redop,o", po::value(&redop)->default_value(redop), "reduce op: sum, max, min, avg")(
      "op", po::value(&ops)->default_value(ops),
      "CCLs, comma-separated: all_reduce, all_gather, reduce_scatter, all_to_all, or all")(
      "dim", po::value(&o.dim)->default_value(0),
      "0: 1-D tensors; 1: [rows, p*k] tensors split or gathered along dim 1 (a non-leading "
      "dim) against the direct MPI call on the same bytes (--device cpu only)")(
      "rows", po::value(&o.rows)->default_value(64), "rows of the 2-D tensors of --dim 1")(
      "rounds", po::value(&o.rounds)->default_value(3),
      "rounds of -n calls per side, timed in alternating windows of at most 2 ms (at least "
      "one call) of meshtest and MPI; each side keeps its best window. --device cuda: every "
      "window is -n calls between two CUDA events")("json", po::value(&o.json),
                                                    "write the rows to this JSON file (rank 0)")(
      "memory", po::value(&memory)->default_value(memory),
      "heap: ordinary tensors; arena: every tensor in the node arena, whose inputs the "
      "shared-memory path reads in place and whose outputs it writes in place "
      "(dist/ccl/arena/arena.hpp; --device cpu only)");
  return parse_options("ccl", argc, argv, desc, [&] {
    o.device = parse_device(device);
    MESHTEST_CHECK(memory == "heap" || memory == "arena", "--memory: '{}' is not heap or arena",
                   memory);
    o.arena = memory == "arena";
    MESHTEST_CHECK(!o.arena || o.device == Device::cpu,
                   "--memory arena: the node arena holds host tensors (--device cpu)");
    const bool cuda = o.device == Device::cuda;
    if (b.empty()) b = cuda ? "8" : "64K";
    if (e.empty()) e = cuda ? "1G" : "32M";
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
    MESHTEST_CHECK(o.dim == 0 || !cuda,
                   "--dim 1 with --device cuda: the GPU table times 1-D buffers (--dim 0)");
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
#if MESHTEST_BENCH_CUDA
  if (o.device == Device::cuda) return run_or_abort("ccl", [&] { return run_cuda(o); });
#endif
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
    // --memory arena: every tensor of the bench in the arena (inputs and outputs, as in a
    // program that opens one for its whole run): room for the largest input, its output, the
    // MPI call's output and the input's first copy, each aligned; past that, the heap.
    if (o.arena) {
      dist::NodeArena::open(4 * static_cast<std::size_t>(o.max_bytes) + (std::size_t{1} << 20));
      dist::NodeArena::use_for_all_tensors();
    }
    // One agreed call makes the shared-memory group when the ranks share a node (shm.hpp).
    (void)dist::all_reduce(mesh, Tensor(Shape{1}, DType::i32));
    const std::string nodes = describe_nodes(mesh.comm());
    if (root) {
      fmt::print("# tensors: {}\n",
                 o.arena
                     ? "in the node arena (--memory arena): inputs read, outputs written in place"
                     : "on the heap (--memory heap)");
      fmt::print("# ranks: {}\n", nodes);
      print_paths(mesh.comm(), p);
    }
    for (CclOp op : o.ops) {
      if (root) print_header(o, op, p);
      std::vector<Row> rows;
      std::vector<double> gbps;
      for (const std::int64_t bytes : sizes_of(o)) {
        rows.push_back(measure(mesh, op, bytes, o));
        if (root) print_row(rows.back(), o.dtype), std::fflush(stdout);
        all.push_back(to_json(rows.back(), o, p));
        gbps.push_back(memcpy_gbps(mesh, rows.back().bytes));
        all.back()["memcpy_gbps"] = gbps.back();
      }
      if (root) print_model(op, p, rows);
      if (root) print_memcpy(op, rows, gbps);
    }
    if (root && !o.json.empty()) write_json(o.json, all);
    std::int64_t wrong = 0;
    for (const auto& r : all) wrong += std::max<std::int64_t>(0, r["wrong"].get<std::int64_t>());
    return wrong == 0 ? 0 : 1;
  });
}

const tools::RegisterSubcommand reg{
    {"ccl",
     "nccl-tests table of the CCLs against the direct MPI call, and the α-β model; --device cuda: "
     "on GPUs against the direct NCCL call",
     &bench_ccl}};

}  // namespace bench_ccl
}  // namespace meshtest::bench::ccl
