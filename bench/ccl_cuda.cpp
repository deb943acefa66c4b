// meshtest-bench ccl --device cuda: the nccl-tests table of meshtest's CCLs on every rank's GPU —
// its default (exact) path and its NCCL path — beside the direct NCCL call on the same
// communicator, stream and buffers, each timed by CUDA events and checked bit for bit.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "bench/ccl_bench.hpp"
#include "bench/ccl_cuda.hpp"
#include "dist/gpu/ccl/exchange.hpp"
#include "dist/gpu/ccl/nccl_calls.hpp"
#include "dist/gpu/ccl/nccl_comm.hpp"
#include "dist/gpu/ccl/rank_gpu.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::bench::ccl {
namespace {

using dist::MeshDevice;
using dist::gpu::NcclGroup;
using dist::gpu::Numerics;
using dist::gpu::Reduce;
using meshtest::gpu::DeviceTensor;

/// One op at one size on this device's buffers: n elements of the whole (all_reduce's vector,
/// all_gather's output, reduce_scatter's input, all_to_all's buffers), in p equal blocks of
/// n / p elements (but for all_reduce, whose n need not divide by p).
struct Call {
  const std::byte* in = nullptr;
  std::byte* out = nullptr;
  std::int64_t n = 0;
  std::vector<std::int64_t> blocks;
  DType t = DType::f32;
  Reduce op = Reduce::sum;
  std::size_t block() const { return static_cast<std::size_t>(blocks.front()); }
};

// ---- meshtest's calls, one small function per op: dist/gpu's raw exchanges on the buffers
// (the CCLs' DeviceTensor front ends take their place once they exist).

void ours_all_reduce(NcclGroup& g, const Call& c, Numerics m) {
  dist::gpu::all_reduce(g, c.in, c.out, c.n, c.t, c.op, m);
}
void ours_reduce_scatter(NcclGroup& g, const Call& c, Numerics m) {
  dist::gpu::reduce_scatter(g, c.in, c.blocks, c.out, c.t, c.op, m);
}
void ours_all_gather(NcclGroup& g, const Call& c, Numerics) {
  dist::gpu::all_gather(g, c.in, c.blocks, c.out, c.t);
}
void ours_all_to_all(NcclGroup& g, const Call& c, Numerics) {
  dist::gpu::all_to_all(g, c.in, c.blocks, c.out, c.blocks, c.t);
}

// ---- the direct NCCL calls, as nccl-tests makes them.

/// One NCCL collective on g's communicator and stream: the call under the NCCL lock, then the
/// poll that a nonblocking communicator needs before its next call (settle), nothing else.
template <class F>
void nccl_call(NcclGroup& g, const char* what, F&& call) {
  {
    dist::gpu::NcclLock lock(what);
    dist::gpu::nccl_check(call(), g.comm(), what, __FILE__, __LINE__);
  }
  dist::gpu::settle(g.comm(), what);
}

void nccl_all_reduce(NcclGroup& g, const Call& c) {
  nccl_call(g, "ncclAllReduce", [&] {
    return ncclAllReduce(c.in, c.out, static_cast<std::size_t>(c.n), dist::gpu::nccl_type(c.t),
                         dist::gpu::nccl_op(c.op), g.comm(), g.stream());
  });
}
void nccl_reduce_scatter(NcclGroup& g, const Call& c) {
  nccl_call(g, "ncclReduceScatter", [&] {
    return ncclReduceScatter(c.in, c.out, c.block(), dist::gpu::nccl_type(c.t),
                             dist::gpu::nccl_op(c.op), g.comm(), g.stream());
  });
}
void nccl_all_gather(NcclGroup& g, const Call& c) {
  nccl_call(g, "ncclAllGather", [&] {
    return ncclAllGather(c.in, c.out, c.block(), dist::gpu::nccl_type(c.t), g.comm(), g.stream());
  });
}
/// nccl-tests' all_to_all: one group of a send and a receive of a block per peer, itself included.
void nccl_all_to_all(NcclGroup& g, const Call& c) {
  const std::size_t k = c.block(), bytes = k * dtype_size(c.t);
  const ncclDataType_t type = dist::gpu::nccl_type(c.t);
  g.grouped("ncclSend/ncclRecv (all_to_all)", [&] {
    for (int r = 0; r < g.size(); ++r) {
      const std::size_t at = static_cast<std::size_t>(r) * bytes;
      MESHTEST_NCCL(ncclSend(c.in + at, k, type, r, g.comm(), g.stream()), g.comm());
      MESHTEST_NCCL(ncclRecv(c.out + at, k, type, r, g.comm(), g.stream()), g.comm());
    }
  });
}

/// Per op: meshtest's call, the direct NCCL call and whether meshtest has an NCCL path for it.
struct GpuCase {
  CclOp op;
  std::string_view nccl_name;
  void (*ours)(NcclGroup&, const Call&, Numerics);
  void (*nccl)(NcclGroup&, const Call&);
  bool reduces;
};

constexpr GpuCase kGpuCases[] = {
    {CclOp::all_reduce, "ncclAllReduce", ours_all_reduce, nccl_all_reduce, true},
    {CclOp::all_gather, "ncclAllGather", ours_all_gather, nccl_all_gather, false},
    {CclOp::reduce_scatter, "ncclReduceScatter", ours_reduce_scatter, nccl_reduce_scatter, true},
    {CclOp::all_to_all, "ncclSend/ncclRecv", ours_all_to_all, nccl_all_to_all, false},
};

const GpuCase& gpu_case(CclOp op) {
  for (const GpuCase& c : kGpuCases) {
    if (c.op == op) return c;
  }
  fail("meshtest-bench ccl --device cuda: no GPU case for {}", dist::ccl_case(op).name);
}

Reduce reduce_of(ReduceOp r) {
  switch (r) {
    case ReduceOp::sum:
      return Reduce::sum;
    case ReduceOp::max:
      return Reduce::max;
    case ReduceOp::min:
      return Reduce::min;
    case ReduceOp::avg:
      return Reduce::avg;
  }
  fail("reduce op {} has no GPU reduction", static_cast<int>(r));
}

// ---- measuring

/// CUDA-event timing on a group's stream.
class Timer {
 public:
  /// Seconds per call of `run`: `iters` calls queued on g's stream between two events, after a
  /// barrier of the idle streams' ranks; the slowest rank's. Collective over comm.
  double per_call(MPI_Comm comm, NcclGroup& g, int iters, const std::function<void()>& run) {
    MESHTEST_MPI(MPI_Barrier(comm));
    start_.record(g.stream());
    for (int i = 0; i < iters; ++i) run();
    stop_.record(g.stream());
    g.synchronize("the timed calls");
    const double t = stop_.elapsed_ms_since(start_) * 1e-3 / iters;
    double slowest = 0;
    MESHTEST_MPI(MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm));
    return slowest;
  }

 private:
  meshtest::gpu::Event start_, stop_;
};

/// Elements of this device's output that differ from `want` after one call of `run` into an
/// output first filled with 0xA5 bytes (a value no case output holds, so an element left
/// unwritten counts), summed over the ranks. Collective over comm.
std::int64_t wrong_after(MPI_Comm comm, NcclGroup& g, DeviceTensor& out, const Tensor& want,
                         const std::function<void()>& run) {
  MESHTEST_DIST_CUDA(cudaMemsetAsync(out.bytes(), 0xA5, out.nbytes(), g.stream()));
  run();
  g.synchronize("the checked call");
  const std::int64_t mine = dist::count_wrong(out.to_host(), want);
  std::int64_t all = 0;
  MESHTEST_MPI(MPI_Allreduce(&mine, &all, 1, MPI_INT64_T, MPI_SUM, comm));
  return all;
}

/// Whether NCCL's reductions give the case table's bits in any order of additions: its inputs
/// are integers in -8..8, so sums of up to 32 terms are exact in bf16 (integers to 256), of up to
/// 256 in f16 (to 2048), and in the others at any p this bench runs; max and min are exact; avg
/// is exact when p is a power of two (each term times 1/p, or the sum divided by p, is then exact
/// too).
bool nccl_order_free(const Options& o, int p) {
  const bool sums = o.dtype == DType::bf16 ? p <= 32 : o.dtype != DType::f16 || p <= 256;
  switch (o.redop) {
    case ReduceOp::max:
    case ReduceOp::min:
      return true;
    case ReduceOp::sum:
      return sums;
    case ReduceOp::avg:
      return sums && (p & (p - 1)) == 0;
  }
  return false;
}

GpuRow measure(const MeshDevice& mesh, NcclGroup& g, Timer& timer, CclOp op, std::int64_t bytes,
               const Options& o) {
  const int p = mesh.size(), me = mesh.device_id();
  const dist::CclCase& cc = dist::ccl_case(op);
  const GpuCase& gc = gpu_case(op);
  const Layout l = layout_of(op, bytes, o, p);
  const dist::CclCall call = call_of(l, op, o, p);
  const DeviceTensor in = DeviceTensor::from_host(cc.input(call, me));
  DeviceTensor out(l.shape(op == CclOp::reduce_scatter ? l.block : l.cols), o.dtype,
                   Tensor::Uninitialized{});
  const Call c{.in = in.bytes(),
               .out = out.bytes(),
               .n = l.cols,
               .blocks = std::vector<std::int64_t>(static_cast<std::size_t>(p), l.cols / p),
               .t = o.dtype,
               .op = reduce_of(o.redop)};
  std::array<std::function<void()>, kSides> runs{};
  runs[kExact] = [&] { gc.ours(g, c, Numerics::exact); };
  if (gc.reduces) runs[kNcclPath] = [&] { gc.ours(g, c, Numerics::nccl); };
  runs[kDirect] = [&] { gc.nccl(g, c); };

  GpuRow row{.op = op,
             .bytes = l.cols * static_cast<std::int64_t>(dtype_size(o.dtype)),
             .count = op == CclOp::all_reduce ? l.cols : l.block,
             .bus_factor = cc.bus_factor(p)};
  for (int i = 0; i < o.warmup; ++i) {
    for (const auto& run : runs) {
      if (run) run();
    }
  }
  g.synchronize("the warm-up calls");
  // Alternate the sides' windows, so that a disturbance hits them alike; each keeps its best.
  for (int r = 0; r < o.rounds; ++r) {
    for (std::size_t s = 0; s < kSides; ++s) {
      if (!runs[s]) continue;
      row.side[s].run = true;
      row.side[s].seconds =
          std::min(row.side[s].seconds, timer.per_call(mesh.comm(), g, o.iters, runs[s]));
    }
  }
  if (o.check) {
    const Tensor want = cc.expected(call, me);
    const bool any_order = !gc.reduces || nccl_order_free(o, p);
    for (std::size_t s = 0; s < kSides; ++s) {
      if (runs[s] && (s == kExact || any_order)) {
        row.side[s].wrong = wrong_after(mesh.comm(), g, out, want, runs[s]);
      }
    }
  }
  return row;
}

}  // namespace

int run_cuda(const Options& o) {
  int me = 0;
  MESHTEST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &me));
  // Agreed on every rank, so that all return together instead of one throwing alone.
  if (const std::string problem = dist::gpu::gpu_binding_problem(); !problem.empty()) {
    if (me == 0) {
      fmt::print(stderr, "meshtest-bench ccl: --device cuda: GPU ranks unavailable: {}\n", problem);
    }
    return 2;
  }
  const int gpu = dist::gpu::bind_rank_to_gpu();
  const MeshDevice mesh = MeshDevice::line();
  const int p = mesh.size();
  const bool root = mesh.device_id() == 0;
  NcclGroup& g = dist::gpu::MeshNccl::of(mesh).group(dist::kAllAxes);
  const std::string nodes = describe_nodes(mesh.comm());
  const std::string gpus = describe_gpus(mesh.comm(), gpu);
  if (root) {
    fmt::print(
        "# meshtest-bench ccl --device cuda: np {}, dtype {}, sizes {} .. {} x{:g}\n"
        "# ranks: {}\n# GPUs: {}\n"
        "# group: the whole world (a line of {}, one NCCL communicator); meshtest's calls: "
        "dist/gpu's exchanges on device buffers\n",
        p, o.dtype, human(static_cast<double>(o.min_bytes)),
        human(static_cast<double>(o.max_bytes)), o.factor, nodes, gpus, p);
  }
  Timer timer;
  nlohmann::json all = nlohmann::json::array();
  std::int64_t wrong = 0, checked = 0;
  for (CclOp op : o.ops) {
    const GpuCase& gc = gpu_case(op);
    if (root) print_gpu_header(o, op, gc.nccl_name, p, nccl_order_free(o, p));
    std::vector<GpuRow> rows;
    for (const std::int64_t bytes : sizes_of(o)) {
      rows.push_back(measure(mesh, g, timer, op, bytes, o));
      if (root) print_gpu_row(rows.back(), o.dtype), std::fflush(stdout);
      all.push_back(to_json(rows.back(), o, p));
      for (const Result& r : rows.back().side) {
        if (r.wrong >= 0) wrong += r.wrong, ++checked;
      }
    }
    if (root) print_gpu_targets(rows, gc.reduces);
  }
  if (root) {
    if (!o.json.empty()) write_json(o.json, all);
    if (wrong == 0) {
      fmt::print("# checked {} results: #wrong 0 in every checked row\n", checked);
    } else {
      fmt::print("# checked {} results: {} wrong elements in all\n", checked, wrong);
    }
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace meshtest::bench::ccl
