// meshtest-bench tp-gpu: the tensor-parallel linear pair of the gpt-oss attention (qkv
// column-parallel, out row-parallel) in bf16 on each rank's GPU, each GEMM's device time against
// a bare cublasGemmEx of the same shard shape timed the same way in the same run, and the cost
// of a scope timed on a stream. Built with the GPU side only (bench/CMakeLists.txt).
#include <cublas_v2.h>
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <boost/program_options.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_common.hpp"
#include "dist/ccl/malloc_tuning.hpp"
#include "dist/gpu/ccl/rank_gpu.hpp"
#include "dist/gpu/parallel/tp_attention.hpp"
#include "dist/mesh/environment.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "dist/perf/gather.hpp"
#include "src/core/random.hpp"
#include "src/gpu/graph.hpp"
#include "src/gpu/linear.hpp"
#include "src/gpu/op_timer.hpp"
#include "src/gpu/runtime.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/report.hpp"
#include "tools/subcommand.hpp"

namespace meshtest::bench {
namespace {

namespace po = boost::program_options;
using dist::DeviceTensor;
using dist::MeshDevice;

struct Options {
  std::int64_t tokens = 2048, hidden = 2880, heads = 64, kv_heads = 8, head_dim = 64;
  int iters = 50, warmup = 10, scope_iters = 20000;
  std::string report = "tp_gpu";  ///< reports/<name>/ ("" : none)
};

int parse(int argc, char** argv, Options& o) {
  po::options_description desc(
      "meshtest-bench tp-gpu: the gpt-oss attention's qkv (column-parallel) and out "
      "(row-parallel) projections in bf16, TP over all ranks (one GPU each): each GEMM's device "
      "time for its shard against a bare cublasGemmEx of the same shape (target: within 10 %), "
      "and the host cost of a timed op with CUPTI and with events (target <= 1 us). Writes the "
      "per-op CSV "
      "and measurements.json to reports/<--report>/.\n"
      "Run as: mpirun -np N -x NCCL_NVLS_ENABLE build/bin/meshtest-bench tp-gpu [options]\n"
      "Options");
  desc.add_options()("help,h", "this help")("tokens", po::value(&o.tokens)->default_value(o.tokens),
                                            "prefill tokens (rows)")(
      "hidden", po::value(&o.hidden)->default_value(o.hidden), "hidden size")(
      "heads", po::value(&o.heads)->default_value(o.heads), "q heads")(
      "kv-heads", po::value(&o.kv_heads)->default_value(o.kv_heads), "kv heads")(
      "head-dim", po::value(&o.head_dim)->default_value(o.head_dim), "head dim")(
      "iters,n", po::value(&o.iters)->default_value(o.iters), "timed iterations")(
      "warmup_iters,w", po::value(&o.warmup)->default_value(o.warmup), "untimed iterations")(
      "scope-iters", po::value(&o.scope_iters)->default_value(o.scope_iters),
      "scopes per overhead measurement")(
      "report", po::value(&o.report)->default_value(o.report),
      "reports/<name>/ for the per-op CSV and measurements.json (empty: none)");
  return parse_options("tp-gpu", argc, argv, desc, [&] {
    MESHTEST_CHECK(o.tokens > 0 && o.hidden > 0 && o.heads > 0 && o.kv_heads > 0 &&
                       o.head_dim > 0 && o.iters > 0 && o.warmup >= 0 && o.scope_iters > 0,
                   "sizes, -n and --scope-iters must be >= 1 and -w >= 0");
  });
}

#define BENCH_CUBLAS_CHECK(expr) \
  MESHTEST_CHECK((expr) == CUBLAS_STATUS_SUCCESS, "cuBLAS call failed: {}", #expr)

/// The bare baseline: y[m, n] = x[m, k] · w[n, k]ᵀ in bf16 with f32 accumulation, no bias.
void bare_gemm(cublasHandle_t h, std::int64_t m, std::int64_t n, std::int64_t k, const void* x,
               const void* w, void* y) {
  const float one = 1.0f, zero = 0.0f;
  BENCH_CUBLAS_CHECK(cublasGemmEx(
      h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
      &one, w, CUDA_R_16BF, static_cast<int>(k), x, CUDA_R_16BF, static_cast<int>(k), &zero, y,
      CUDA_R_16BF, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/// The slowest rank's value of `v`.
double slowest(MPI_Comm comm, double v) {
  double out = 0;
  MESHTEST_MPI(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, comm));
  return out;
}

int run(const Options& o) {
  int me = 0;
  MESHTEST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &me));
  if (const std::string problem = dist::gpu::gpu_binding_problem(); !problem.empty()) {
    if (me == 0) fmt::print(stderr, "meshtest-bench tp-gpu: GPU ranks unavailable: {}\n", problem);
    return 2;
  }
  dist::gpu::bind_rank_to_gpu();
  const MeshDevice mesh = MeshDevice::line();
  const int p = mesh.size(), i = mesh.device_id();
  const bool root = i == 0;
  MESHTEST_CHECK(o.heads % p == 0 && o.kv_heads % p == 0,
                 "tp-gpu: {} q heads and {} kv heads must split over {} ranks", o.heads, o.kv_heads,
                 p);
  const std::int64_t d = o.head_dim, hp = o.heads / p * d, kvp = o.kv_heads / p * d;
  const std::int64_t qkv_out = hp + 2 * kvp;
  const DType t = DType::bf16;
  auto normal = [&](Shape s, std::uint64_t stream, double std) {
    return DeviceTensor::from_host(random_normal(s, t, {.seed = 4, .stream = stream}, 0.0, std));
  };
  const DeviceTensor x = normal({o.tokens, o.hidden}, 1, 1.0);
  const DeviceTensor o_local = normal({o.tokens, hp}, 2 + static_cast<std::uint64_t>(i), 1.0);
  const dist::TpAttentionProjections w{
      .qkv_weight = normal({qkv_out, o.hidden}, 10 + static_cast<std::uint64_t>(i), 0.02),
      .qkv_bias = normal({qkv_out}, 20 + static_cast<std::uint64_t>(i), 0.02),
      .out_weight = normal({o.hidden, hp}, 30 + static_cast<std::uint64_t>(i), 0.02),
      .out_bias = normal({o.hidden}, 40, 0.02)};
  gpu::Blas blas;

  // 1. meshtest's pair under the profiler: qkv, out (GEMM + all_reduce), per iteration.
  std::vector<perf::OpRecord> mine;
  {
    const perf::Session session;
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      if (it >= o.warmup) perf::signpost("start");
      const DeviceTensor qkv = dist::tp_qkv_projection(blas, x, w);
      const DeviceTensor out = dist::tp_out_projection(mesh, blas, o_local, w);
      if (it >= o.warmup) perf::signpost("stop");
    }
    mine = perf::records();
  }
  std::array<double, 3> sum{};  // qkv linear, out linear, all_reduce (ns), measured iterations
  {
    bool measured = false;
    int linear = 0;
    for (const perf::OpRecord& r : mine) {
      if (r.op_code == "signpost") {
        measured = r.attributes == "start", linear = 0;
      } else if (measured && r.op_code == "linear") {
        sum[linear++ == 0 ? 0 : 1] += static_cast<double>(r.duration_ns());
      } else if (measured && r.op_code.starts_with("all_reduce")) {  // all_reduce_inplace
        sum[2] += static_cast<double>(r.duration_ns());
      }
    }
  }
  std::array<double, 3> ours{};
  for (std::size_t k = 0; k < 3; ++k) ours[k] = slowest(mesh.comm(), sum[k] / o.iters / 1e3);

  // 2. The bare calls, timed as the scopes are: an event before and after each, the stream
  // idle before the first (as after meshtest's all_reduce) and busy before the second.
  cublasHandle_t h = nullptr;
  BENCH_CUBLAS_CHECK(cublasCreate(&h));
  BENCH_CUBLAS_CHECK(cublasSetStream(h, blas.stream()));
  DeviceTensor y1(Shape{o.tokens, qkv_out}, t), y2(Shape{o.tokens, o.hidden}, t);
  std::array<gpu::Event, 4> ev;
  double bare1 = 0, bare2 = 0;
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    blas.synchronize();
    ev[0].record(blas.stream());
    bare_gemm(h, o.tokens, qkv_out, o.hidden, x.bytes(), w.qkv_weight.bytes(), y1.bytes());
    ev[1].record(blas.stream());
    ev[2].record(blas.stream());
    bare_gemm(h, o.tokens, o.hidden, hp, o_local.bytes(), w.out_weight.bytes(), y2.bytes());
    ev[3].record(blas.stream());
    ev[3].synchronize();
    if (it >= o.warmup) {
      bare1 += ev[1].elapsed_ms_since(ev[0]) * 1e3;
      bare2 += ev[3].elapsed_ms_since(ev[2]) * 1e3;
    }
  }
  bare1 = slowest(mesh.comm(), bare1 / o.iters), bare2 = slowest(mesh.comm(), bare2 / o.iters);

  // 2b. The pair as CUDA graphs: meshtest's two linears as the TP ops queue them (bias on the
  // out GEMM of device 0 only), and the two bare calls, each captured once and replayed back to
  // back: no host time reaches the device between the GEMMs, so the ratio is the kernels'.
  const DeviceTensor cublas_ws(Shape{32 << 20}, DType::u8, Tensor::Uninitialized{});
  BENCH_CUBLAS_CHECK(cublasSetWorkspace(h, const_cast<std::byte*>(cublas_ws.bytes()),
                                        static_cast<std::size_t>(cublas_ws.nbytes())));
  gpu::Graph g_ours, g_bare;
  DeviceTensor gq, gout;
  g_ours.capture([&] {
    gq = gpu::linear(blas, x, w.qkv_weight, w.qkv_bias);
    gout = i == 0 ? gpu::linear(blas, o_local, w.out_weight, w.out_bias)
                  : gpu::linear(blas, o_local, w.out_weight);
  });
  g_bare.capture([&] {
    BENCH_CUBLAS_CHECK(cublasSetStream(h, gpu::capturing_stream()));
    bare_gemm(h, o.tokens, qkv_out, o.hidden, x.bytes(), w.qkv_weight.bytes(), y1.bytes());
    bare_gemm(h, o.tokens, o.hidden, hp, o_local.bytes(), w.out_weight.bytes(), y2.bytes());
  });
  const auto replay_us = [&](gpu::Graph& g) {
    for (int it = 0; it < o.warmup; ++it) g.replay();
    ev[0].record(g.stream());
    for (int it = 0; it < o.iters; ++it) g.replay();
    ev[1].record(g.stream());
    ev[1].synchronize();
    return slowest(mesh.comm(), ev[1].elapsed_ms_since(ev[0]) * 1e3 / o.iters);
  };
  const double graph_ours = replay_us(g_ours), graph_bare = replay_us(g_bare);
  cublasDestroy(h);

  // 3. The host cost of a timed op: what a scope timed on the stream (opened, timed, given a
  // tensor, closed) adds to the op's launch (a 4-byte memset), with CUPTI (its own per-launch
  // cost included) and with events, over the same launch untimed with CUPTI's records off.
  const auto per_op_ns = [&](const std::function<void()>& op) {
    double best = 1e30;
    for (int round = 0; round < 3; ++round) {
      const perf::Session session;
      const std::int64_t t0 = perf::now_ns();
      for (int k = 0; k < o.scope_iters; ++k) op();
      best = std::min(best, static_cast<double>(perf::now_ns() - t0) / o.scope_iters);
      blas.synchronize();
    }
    return slowest(mesh.comm(), best);
  };
  const perf::TensorInfo x_info{.shape = x.shape(), .dtype = t};
  gpu::DeviceTensor word(Shape{1}, DType::f32);
  const auto launch = [&] {
    MESHTEST_CUDA_CHECK(cudaMemsetAsync(word.bytes(), 0, word.nbytes(), blas.stream()));
  };
  const auto timed_op = [&] {
    perf::OpScope s("bench_op");
    gpu::time_on_stream(s, blas.stream());
    s.input(x_info);
    launch();
  };
  gpu::set_gpu_timer(gpu::GpuTimer::events);  // CUPTI's records off
  const double bare_ns = per_op_ns(launch);
  const double events_ns = per_op_ns(timed_op) - bare_ns;
  gpu::set_gpu_timer(gpu::GpuTimer::cupti);
  const std::string cupti_why = gpu::cupti_problem();
  const double cupti_ns = cupti_why.empty() ? per_op_ns(timed_op) - bare_ns : 0.0;
  gpu::set_gpu_timer(std::nullopt);
  const double host_scope_ns = per_op_ns([&] {
    perf::OpScope s("bench_op");
    s.input(x_info);
  });
  // Timing's cost where the timer is the default (CUPTI where it starts).
  const double scope_ns = cupti_why.empty() ? cupti_ns : events_ns;

  const auto all = dist::gather_records(mesh, mine);
  std::string written;
  if (root && !o.report.empty()) {
    const perf::ReportFiles f = perf::write_report(all, {.name = o.report, .plot = false});
    written = fmt::format("{} and {}", f.csv.string(), f.measurements.string());
  }
  if (!root) return 0;
  const double f1 = 2.0 * o.tokens * o.hidden * qkv_out, f2 = 2.0 * o.tokens * hp * o.hidden;
  fmt::print(
      "# meshtest-bench tp-gpu: np {}, bf16 (f32 accumulation), tokens {}, hidden {}, {} q / {} "
      "kv heads x {}; per GPU: qkv [{}, {}] x [{}, {}]^T + bias, out [{}, {}] x [{}, {}]^T "
      "(+ bias on rank 0), all_reduce of [{}, {}]\n"
      "# device times from CUDA events, mean of {} iterations after {} warm-up, slowest rank\n"
      "#{:>10} {:>14} {:>14} {:>10} {:>10} {:>8}\n",
      p, o.tokens, o.hidden, o.heads, o.kv_heads, d, o.tokens, o.hidden, qkv_out, o.hidden,
      o.tokens, hp, o.hidden, hp, o.tokens, o.hidden, o.iters, o.warmup, "gemm", "meshtest us",
      "cublasGemmEx us", "ratio", "TFLOP/s", "target");
  bool ok = true;
  auto row = [&](const char* name, double ours_us, double bare_us, double flops) {
    const double ratio = ours_us / bare_us;
    ok = ok && ratio <= 1.10;
    fmt::print(" {:>10} {:>14.2f} {:>14.2f} {:>10.3f} {:>10.1f} {:>8}\n", name, ours_us, bare_us,
               ratio, flops / ours_us / 1e6, ratio <= 1.10 ? "ok" : "MISSED");
  };
  row("qkv", ours[0], bare1, f1);
  row("out", ours[1], bare2, f2);
  row("qkv+out*", graph_ours, graph_bare, f1 + f2);
  fmt::print(
      "# *as CUDA graphs, the two GEMMs replayed back to back (no host time between them on "
      "the device): the kernels alone\n");
  fmt::print(
      "# all_reduce of the out partials (exact path): {:.2f} us per call\n"
      "# a timed op's host cost over its bare launch (a 4-byte memset, {:.3f} us; open, "
      "time_on_stream, input, close): CUPTI {} (target <= 1 us: {}), events {:.3f} us\n"
      "#   of which the scope on the host clock {:.3f} us\n",
      ours[2], bare_ns / 1e3,
      cupti_why.empty() ? fmt::format("{:.3f} us", cupti_ns / 1e3) : "unavailable: " + cupti_why,
      scope_ns <= 1000 ? "ok" : "MISSED", events_ns / 1e3, host_scope_ns / 1e3);
  if (!written.empty()) fmt::print("# per-op report: {}\n", written);
  fmt::print("# targets: {}\n", ok && scope_ns <= 1000 ? "all met" : "NOT all met");
  return 0;
}

int bench_tp_gpu(int argc, char** argv) {
  Options o;
  if (const int rc = parse(argc, argv, o); rc != 0) return rc == 1 ? 0 : rc;
  dist::tune_malloc_for_collectives();
  dist::Environment env(argc, argv);
  return run_or_abort("tp-gpu", [&] { return run(o); });
}

const tools::RegisterSubcommand reg{
    {"tp-gpu", "gpt-oss TP linear pair on GPUs (bf16) against bare cuBLAS, and the scope cost",
     &bench_tp_gpu}};

}  // namespace
}  // namespace meshtest::bench
