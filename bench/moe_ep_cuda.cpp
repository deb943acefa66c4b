// moe_ep_cuda (bench/moe_tables.hpp): tables (b) and (c) of meshtest-bench moe on GPU ranks, the
// expert-parallel exchanges and block (dist/gpu/parallel/ep_moe.hpp) against NCCL's own
// all_to_all and the TP block.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "bench/moe_tables.hpp"
#include "dist/gpu/ccl/ccl.hpp"
#include "dist/gpu/ccl/nccl_calls.hpp"
#include "dist/gpu/ccl/nccl_comm.hpp"
#include "dist/gpu/ccl/rank_gpu.hpp"
#include "dist/gpu/parallel/ep_moe.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "dist/perf/e2e.hpp"
#include "src/core/random.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/linear.hpp"
#include "src/gpu/moe.hpp"
#include "src/gpu/rms_norm.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::bench {
namespace moe_ep_cuda {

using dist::MeshDevice;
using gpu::DeviceTensor;

constexpr double kExchangeTarget = 0.9;   // dispatch + combine >= 0.9 x NCCL's all_to_all
constexpr double kComputeTarget = 1.5;    // the EP block's compute <= 1.5 x its GEMMs
constexpr double kJudgedBytes = 1 << 20;  // the exchange target holds from 1 MiB per device
constexpr int kExchangeCalls = 10;        // exchanges per o.iters (they are short)

double max_over(const MeshDevice& mesh, double v) {
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, mesh.comm()));
  return v;
}

std::int64_t sum(const std::vector<std::int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), std::int64_t{0});
}

/// w with every tensor in dtype d.
dist::EpMlpWeights in_dtype(dist::EpMlpWeights w, DType d) {
  MlpWeights& m = w.mlp;
  for (Tensor* t : {&m.norm_scale, &m.gate_weight, &m.gate_bias, &m.mlp1_weight, &m.mlp1_bias,
                    &m.mlp2_weight, &m.mlp2_bias}) {
    *t = t->astype(d);
  }
  return w;
}

/// One case of tables (b) and (c) on GPU ranks: the host problem, its weights and tokens on
/// this rank's GPU in the bench's dtype, and the traffic of the GPU router's routing.
struct GpuCase {
  std::string name;
  EpProblem s;
  dist::GpuEpMlpWeights w;
  DeviceTensor x;
  std::vector<DeviceTraffic> traffic;
};

GpuCase make_case(const MeshDevice& mesh, const MoeBenchOptions& o, std::string name,
                  std::int64_t tokens, gpu::Blas& blas, DType dtype) {
  GpuCase c{.name = std::move(name),
            .s = make_ep_problem(mesh, o, tokens),
            .w = {},
            .x = {},
            .traffic = {}};
  c.w = dist::to_gpu(in_dtype(c.s.w, dtype));
  c.x = DeviceTensor::from_host(c.s.x.astype(dtype));
  // The routing ep_mlp_block computes on the GPU (the same ops), for the exchanges' counts.
  const DeviceTensor t = gpu::rms_norm(c.x, c.w.norm_scale, blas.stream(), c.s.p.norm_eps);
  const gpu::DeviceRouting r =
      gpu::gate(gpu::linear(blas, t, c.w.gate_weight, c.w.gate_bias), o.k, blas.stream());
  blas.synchronize();
  c.traffic = ep_traffic_of(mesh, r.to_host(), c.s.placement, o.ep_axis);
  return c;
}

/// NCCL's own all_to_all of the EP exchange's rows on g: to[d] rows of row_bytes to each device
/// d and from[d] from each (the dispatch), then the reverse (the combine), each one group of
/// ncclSend/ncclRecv as nccl-tests makes it; waits for both.
void nccl_exchange(dist::gpu::NcclGroup& g, const DeviceTensor& rows, DeviceTensor& in,
                   DeviceTensor& back, const std::vector<std::int64_t>& to,
                   const std::vector<std::int64_t>& from, std::size_t row_bytes) {
  const auto pass = [&](const std::byte* send, const std::vector<std::int64_t>& sends,
                        std::byte* recv, const std::vector<std::int64_t>& recvs, const char* what) {
    g.grouped(what, [&] {
      std::size_t at_send = 0, at_recv = 0;
      for (int d = 0; d < g.size(); ++d) {
        const std::size_t sn =
            static_cast<std::size_t>(sends[static_cast<std::size_t>(d)]) * row_bytes;
        const std::size_t rn =
            static_cast<std::size_t>(recvs[static_cast<std::size_t>(d)]) * row_bytes;
        if (sn > 0) {
          MESHTEST_NCCL(ncclSend(send + at_send, sn, ncclInt8, d, g.comm(), g.stream()), g.comm());
        }
        if (rn > 0) {
          MESHTEST_NCCL(ncclRecv(recv + at_recv, rn, ncclInt8, d, g.comm(), g.stream()), g.comm());
        }
        at_send += sn;
        at_recv += rn;
      }
    });
  };
  pass(rows.bytes(), to, in.bytes(), from, "ncclSend/ncclRecv (the EP dispatch's rows)");
  pass(in.bytes(), from, back.bytes(), to, "ncclSend/ncclRecv (the EP combine's rows)");
  g.synchronize("NCCL's all_to_all of the EP rows");
}

/// Min and mean ms per call of f (time_e2e: a barrier before each call, the slowest device).
struct Ms {
  double min = 0, mean = 0;
};
Ms timed(const MeshDevice& mesh, const std::function<void()>& f, int warmup, int calls) {
  const perf::E2eStats st = dist::time_e2e(mesh, f, {.warmup = warmup, .iterations = calls});
  return {.min = st.min_us * 1e-3, .mean = st.mean_us * 1e-3};
}

/// Table (b)'s row of a case: the EP exchange (meshtest's all_to_all_v of device tensors, the
/// dispatch and the combine) against NCCL's of the same rows and all_gather-everything, in two
/// alternating rounds (the min of each).
nlohmann::json exchange_row(const MeshDevice& mesh, const MoeBenchOptions& o, const GpuCase& c,
                            DType dtype, std::string& verdict) {
  const DeviceTraffic& me = c.traffic[static_cast<std::size_t>(c.w.device)];
  const std::size_t row_bytes = static_cast<std::size_t>(o.hidden) * dtype_size(dtype);
  const DeviceTensor rows = DeviceTensor::from_host(
      random_uniform(Shape{sum(me.to), o.hidden}, dtype, {.seed = o.seed, .stream = 13}, -1, 1));
  DeviceTensor in(Shape{sum(me.from), o.hidden}, dtype, Tensor::Uninitialized{});
  DeviceTensor back(rows.shape(), dtype, Tensor::Uninitialized{});
  dist::gpu::NcclGroup& g = dist::gpu::MeshNccl::of(mesh).group(o.ep_axis);
  const dist::AllToAllOptions a2a{.axis = o.ep_axis};
  const auto ours = [&] {
    const DeviceTensor got = dist::all_to_all_v(mesh, rows, me.to, a2a);
    (void)dist::all_to_all_v(mesh, got, me.from, a2a);
  };
  const auto nccl = [&] { nccl_exchange(g, rows, in, back, me.to, me.from, row_bytes); };
  const auto ag = [&] {
    const DeviceTensor all = dist::all_gather(mesh, c.x, {.dim = 0, .axis = o.ep_axis});
    (void)dist::reduce_scatter(mesh, all, {.dim = 0, .axis = o.ep_axis});
  };
  const int calls = kExchangeCalls * o.iters;
  Ms ep{1e30, 0}, nc{1e30, 0}, al{1e30, 0};
  for (int round = 0; round < 2; ++round) {
    const Ms a = timed(mesh, ours, o.warmup + 1, calls), b = timed(mesh, nccl, o.warmup + 1, calls);
    const Ms d = timed(mesh, ag, o.warmup + 1, calls);
    ep = {std::min(ep.min, a.min), ep.mean + a.mean / 2};
    nc = {std::min(nc.min, b.min), nc.mean + b.mean / 2};
    al = {std::min(al.min, d.min), al.mean + d.mean / 2};
  }
  // Bytes a device sends to the others in the dispatch (and receives back in the combine).
  double sent = 0, min_rows = 0, ep_rows = 0;
  for (const DeviceTraffic& t : c.traffic) {
    sent = std::max(sent, static_cast<double>(t.ep_rows) * static_cast<double>(row_bytes));
    min_rows += static_cast<double>(t.min_rows);
    ep_rows += static_cast<double>(t.ep_rows);
  }
  const double ratio = ep.min > 0 ? nc.min / ep.min : 0;
  const bool judged = sent >= kJudgedBytes;
  verdict = !judged ? "below 1 MiB" : (ratio >= kExchangeTarget ? "meets" : "misses");
  if (mesh.device_id() == 0) {
    fmt::print(
        "{:<8} {:>6} {:>9} {:>10.3f} {:>7.3f} | {:>9.3f} {:>9.3f} {:>9.3f} {:>6.2f}  {:<11} | "
        "{:>9.3f} {:>6.2f}\n",
        c.name, c.s.tokens, sum(me.to), sent / 1e6, min_rows > 0 ? ep_rows / min_rows : 1.0, ep.min,
        ep.mean, nc.min, ratio, verdict, al.min, al.min / ep.min);
  }
  return {{"case", c.name},
          {"tokens", c.s.tokens},
          {"rows_sent_device0", sum(me.to)},
          {"max_bytes_to_others", sent},
          {"ep_over_min_rows", min_rows > 0 ? ep_rows / min_rows : 1.0},
          {"ep_min_ms", ep.min},
          {"ep_mean_ms", ep.mean},
          {"nccl_min_ms", nc.min},
          {"nccl_mean_ms", nc.mean},
          {"nccl_over_ep", ratio},
          {"all_gather_min_ms", al.min},
          {"verdict", verdict}};
}

/// The block's figures from its ops' records (o.iters calls under the profiler), per call, the
/// slowest device's: its dispatch and combine (the all_to_all_v of device tensors; the side
/// lists are f64 host tensors), its grouped GEMMs (timed on the stream), and device 0's ops by
/// time (the largest first).
struct BlockRecords {
  double exchange_ms = 0, gemm_ms = 0;
  std::vector<std::pair<std::string, double>> by_op;
};
BlockRecords block_records(const MeshDevice& mesh, const std::function<void()>& block, int iters) {
  std::vector<perf::OpRecord> recs;
  {
    const perf::Session session;
    for (int it = 0; it < iters; ++it) block();
    recs = perf::records();
  }
  BlockRecords b;
  std::map<std::string, double> by_op;
  for (const perf::OpRecord& r : recs) {
    const double ms = static_cast<double>(r.duration_ns()) * 1e-6 / iters;
    const bool host = !r.inputs.empty() && r.inputs[0].dtype == DType::f64;
    by_op[r.op_code + (host ? " (host)" : "")] += ms;
    if (r.op_code == "grouped_gemm") b.gemm_ms += ms;
    if (r.op_code == "all_to_all_v" && !host) b.exchange_ms += ms;
  }
  b.by_op.assign(by_op.begin(), by_op.end());
  std::sort(b.by_op.begin(), b.by_op.end(),
            [](const auto& x, const auto& y) { return x.second > y.second; });
  b.exchange_ms = max_over(mesh, b.exchange_ms);
  b.gemm_ms = max_over(mesh, b.gemm_ms);
  return b;
}

/// Table (c)'s row of a case: the EP block, its compute against its GEMMs, and the TP block
/// (EP size 1 on `line`, the 1 x N mesh of the same ranks: every device all T tokens and 1/N of
/// every expert's units).
nlohmann::json block_row(const MeshDevice& mesh, const MeshDevice& line, const MoeBenchOptions& o,
                         const GpuCase& c, gpu::Blas& blas, DType dtype, std::string& verdict) {
  const auto ep_block = [&] { (void)dist::ep_mlp_block(mesh, blas, c.x, c.w, c.s.p, c.s.o); };
  const Ms ep = timed(mesh, ep_block, o.warmup + 1, o.iters);
  const BlockRecords rec = block_records(mesh, ep_block, o.iters);
  const double compute = ep.mean - rec.exchange_ms;
  const double ratio = rec.gemm_ms > 0 ? compute / rec.gemm_ms : 0;
  verdict = ratio <= kComputeTarget ? "meets" : "misses";
  Ms tp{};
  std::string tp_note;
  const int n = line.size();
  if (o.intermediate % n != 0) {
    tp_note =
        fmt::format("skipped: {} devices do not divide the intermediate {}", n, o.intermediate);
  } else {
    const dist::EpOptions to{.ep_axis = 0};
    const ExpertPlacement one =
        dist::place_experts(dist::ExpertAssignment::Contiguous, o.experts, 1);
    const dist::GpuEpMlpWeights w = dist::to_gpu(in_dtype(
        dist::shard_ep_mlp_weights(c.s.src, c.s.c, 0, one, 0, dist::ep_tp_rank(line, to)), dtype));
    const DeviceTensor x =
        DeviceTensor::from_host(ep_tokens(o, c.s.tokens, {0, c.s.tokens}).astype(dtype));
    tp = timed(
        line, [&] { (void)dist::ep_mlp_block(line, blas, x, w, c.s.p, to); }, o.warmup + 1,
        o.iters);
  }
  if (mesh.device_id() == 0) {
    fmt::print(
        "{:<8} {:>6} {:>9.3f} {:>9.3f} | {:>9.3f} {:>6.1f}% {:>9.3f} {:>9.3f} {:>6.2f}  {:<6} | "
        "{:>9} {:>6}\n",
        c.name, c.s.tokens, ep.min, ep.mean, rec.exchange_ms,
        ep.mean > 0 ? 100 * rec.exchange_ms / ep.mean : 0.0, compute, rec.gemm_ms, ratio, verdict,
        tp_note.empty() ? fmt::format("{:.3f}", tp.min) : "-",
        tp_note.empty() ? fmt::format("{:.2f}", tp.min / ep.min) : "-");
    if (!tp_note.empty()) fmt::print("  TP block {}\n", tp_note);
    std::string ops;
    for (std::size_t i = 0; i < std::min<std::size_t>(rec.by_op.size(), 10); ++i) {
      ops +=
          fmt::format("{}{} {:.3f}", i == 0 ? "" : ", ", rec.by_op[i].first, rec.by_op[i].second);
    }
    fmt::print(
        "  device 0's ops by ms per call (device time on the stream, host time for the "
        "CCLs): {}\n",
        ops);
  }
  return {{"case", c.name},
          {"tokens", c.s.tokens},
          {"ep_min_ms", ep.min},
          {"ep_mean_ms", ep.mean},
          {"dispatch_combine_ms", rec.exchange_ms},
          {"compute_ms", compute},
          {"gemms_ms", rec.gemm_ms},
          {"compute_over_gemms", ratio},
          {"tp_min_ms", tp_note.empty() ? nlohmann::json(tp.min) : nlohmann::json(tp_note)},
          {"verdict", verdict}};
}

}  // namespace moe_ep_cuda

bool ep_tables_cuda(const dist::MeshDevice& mesh, const MoeBenchOptions& o, nlohmann::json& doc,
                    Verdicts& v) {
  using namespace moe_ep_cuda;
  // Agreed on every rank, so that all return together instead of one throwing alone.
  if (const std::string problem = dist::gpu::gpu_binding_problem(); !problem.empty()) {
    if (mesh.device_id() == 0) {
      fmt::print(stderr, "meshtest-bench moe: --device cuda: GPU ranks unavailable: {}\n", problem);
    }
    return false;
  }
  const int gpu_id = dist::gpu::bind_rank_to_gpu();
  const DType dtype = o.dtype == "bf16" ? DType::bf16 : DType::f32;
  gpu::Blas blas;
  const MeshDevice line(std::vector<int>{1, mesh.size()});
  const int ep = mesh.axis_size(o.ep_axis), tp = mesh.axis_size(1 - o.ep_axis);
  std::vector<GpuCase> cases;
  cases.push_back(make_case(mesh, o, "prefill", o.tokens, blas, dtype));
  cases.push_back(make_case(mesh, o, "decode", o.decode, blas, dtype));
  if (mesh.device_id() == 0) {
    fmt::print(
        "\nGPU ranks: {} on mesh {} (EP {} on axis {}, TP {}), rank 0 on cuda:{}; {}, "
        "hidden {}, intermediate {}, {} experts top-{}\n",
        mesh.size(), mesh.str(), ep, o.ep_axis, tp, gpu_id, o.dtype, o.hidden, o.intermediate,
        o.experts, o.k);
  }
  if (o.parts.count("exchange") != 0) {
    if (mesh.device_id() == 0) {
      fmt::print(
          "\n(b) dispatch + combine on GPU ranks (the EP axis, {} devices): meshtest's "
          "all_to_all_v of device tensors (the dispatch's rows, one per token and device holding "
          "one of its experts, and the combine's rows back) against NCCL's own all_to_all of the "
          "same rows (one group of ncclSend/ncclRecv each way, on the same communicator) and "
          "all_gather-everything (all_gather of the tokens, reduce_scatter of the outputs); the "
          "routing of the GPU's router; ms per dispatch + combine, min and mean of 2 rounds of "
          "{} calls each after a barrier, slowest device; MB = the most a device sends to the "
          "others each way; EP/min = EP rows / the minimum rows over all devices; NCCL/EP = "
          "NCCL's time / meshtest's (target >= {} from 1 MiB)\n",
          ep, kExchangeCalls * o.iters, kExchangeTarget);
      fmt::print("{:<8} {:>6} {:>9} {:>10} {:>7} | {:>9} {:>9} {:>9} {:>6}  {:<11} | {:>9} {:>6}\n",
                 "case", "tokens", "rows dev0", "MB/dev", "EP/min", "EP ms", "mean", "NCCL ms",
                 "NCCL/EP", "target", "AG ms", "AG/EP");
    }
    nlohmann::json rows = nlohmann::json::array();
    std::string judged;
    for (const GpuCase& c : cases) {
      std::string verdict;
      rows.push_back(exchange_row(mesh, o, c, dtype, verdict));
      judged += fmt::format("{}{} {:.2f} ({})", judged.empty() ? "" : ", ", c.name,
                            rows.back()["nccl_over_ep"].get<double>(), verdict);
    }
    doc["cuda_exchange"] = rows;
    v.lines.push_back(fmt::format(
        "dispatch + combine >= {} x NCCL's all_to_all of the same rows (from 1 MiB), {} GPUs: {}",
        kExchangeTarget, mesh.size(), judged));
  }
  if (o.parts.count("block") != 0) {
    if (mesh.device_id() == 0) {
      fmt::print(
          "\n(c) the MoE MLP block on GPU ranks (dist/gpu/parallel/ep_moe: router, dispatch, "
          "grouped GEMMs, combine, residual): EP ms = min and mean of {} calls, each after a "
          "barrier, slowest device; from the block's records ({} calls, per call, slowest "
          "device): d+c = its dispatch and combine (all_to_all_v of device tensors) and their "
          "share of the block's mean, compute = the mean less them, GEMMs = its grouped GEMMs on "
          "the "
          "stream (target: compute <= {} x GEMMs); TP = the TP block (EP size 1: every device "
          "all the tokens and 1/{} of every expert's units), min ms and TP/EP\n",
          o.iters, o.iters, kComputeTarget, mesh.size());
      fmt::print("{:<8} {:>6} {:>9} {:>9} | {:>9} {:>7} {:>9} {:>9} {:>6}  {:<6} | {:>9} {:>6}\n",
                 "case", "tokens", "EP ms", "mean", "d+c ms", "share", "compute", "GEMMs ms",
                 "ratio", "target", "TP ms", "TP/EP");
    }
    nlohmann::json rows = nlohmann::json::array();
    std::string judged;
    for (const GpuCase& c : cases) {
      std::string verdict;
      rows.push_back(block_row(mesh, line, o, c, blas, dtype, verdict));
      judged += fmt::format("{}{} {:.2f} ({})", judged.empty() ? "" : ", ", c.name,
                            rows.back()["compute_over_gemms"].get<double>(), verdict);
    }
    doc["cuda_blocks"] = rows;
    v.lines.push_back(fmt::format("EP block compute <= {} x its grouped GEMMs, {} GPUs: {}",
                                  kComputeTarget, mesh.size(), judged));
  }
  return true;
}

}  // namespace meshtest::bench
