// gpt_oss_cuda: meshtest-bench gpt-oss --device cuda — one gpt-oss block on GPU ranks
// (dist/gpu/parallel/tp_transformer.hpp, TP over every rank): per-op device time, TFLOP/s and
// GB/s for a prefill and for a batch decode step over KV caches, the shares of the GEMMs, the
// attention and the CCLs, and the targets against the GPU's bf16 peak and bandwidth.
#include "bench/gpt_oss_cuda.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <mpi.h>

#include <boost/program_options.hpp>
#include <charconv>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "dist/gpu/ccl/rank_gpu.hpp"
#include "dist/gpu/parallel/tp_transformer.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/core/file.hpp"
#include "src/core/random.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/runtime.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/perf/profiler.hpp"
#include "tools/mpi_subcommand.hpp"

namespace meshtest::bench {
namespace gpt_oss_cuda {

namespace po = boost::program_options;
using dist::MeshDevice;
using gpu::DeviceTensor;

constexpr double kPrefillAttentionTarget = 0.30;  // of the bf16 dense peak, causal half counted
constexpr double kDecodeAttentionTarget = 0.60;   // of the memory bandwidth, KV bytes read
constexpr double kBlockTarget = 1.5;              // compute kernels <= 1.5 x GEMMs + attention

struct Options {
  std::string config = "20b";
  std::int64_t tokens = 2048, decode = 64, position = 4096;
  std::vector<std::int64_t> layers{1, 0};
  int iters = 3, warmup = 1;
  double peak_tflops = 0, peak_tbs = 0;
  std::string json;
};

/// The GPU's bf16 dense tensor-core peak (TFLOP/s) and memory bandwidth (TB/s): --peak-tflops
/// and --peak-tbs, else by its name from NVIDIA's data sheets (SXM parts), else 0 (unknown).
struct Peak {
  std::string name;
  double tflops = 0, tbs = 0;
};

Peak device_peak(const Options& o) {
  cudaDeviceProp prop{};
  MESHTEST_CUDA_CHECK(cudaGetDeviceProperties(&prop, gpu::current_device()));
  Peak p{.name = prop.name, .tflops = 0, .tbs = 0};
  if (p.name.find("H200") != std::string::npos) {
    p.tflops = 989.5, p.tbs = 4.8;
  } else if (p.name.find("H100") != std::string::npos) {
    p.tflops = 989.5, p.tbs = 3.35;
  }
  if (o.peak_tflops > 0) p.tflops = o.peak_tflops;
  if (o.peak_tbs > 0) p.tbs = o.peak_tbs;
  return p;
}

/// One op code's figures per block call: device ms (ops timed on the stream; host ms for the
/// CCLs), its counted flops and bytes, how often it runs.
struct OpSum {
  double ms = 0, flops = 0, bytes = 0, calls = 0;
  bool ccl = false;
};
using OpSums = std::map<std::string, OpSum>;

/// call(i) for i < warmup, then iters more under the profiler: the ops per call, this device's.
OpSums op_sums(const std::function<void(int)>& call, const Options& o) {
  for (int i = 0; i < o.warmup; ++i) call(i);
  std::vector<perf::OpRecord> recs;
  {
    const perf::Session session;
    for (int i = 0; i < o.iters; ++i) call(o.warmup + i);
    recs = perf::records();
  }
  OpSums m;
  const double n = o.iters;
  for (const perf::OpRecord& r : recs) {
    OpSum& s = m[r.op_code];
    s.ms += static_cast<double>(r.duration_ns()) * 1e-6 / n;
    s.flops += r.flops / n;
    s.bytes += static_cast<double>(r.bytes) / n;
    s.calls += 1 / n;
    s.ccl = r.op_type == perf::OpType::ccl;
  }
  return m;
}

/// Across the devices (every one runs the same ops): the compute ops' slowest device, the CCLs'
/// mean, as meshtest's op reports aggregate them.
void aggregate(const MeshDevice& mesh, OpSums& m) {
  std::vector<double> most, total;
  for (const auto& [op, s] : m) most.push_back(s.ms), total.push_back(s.ms);
  const auto n = static_cast<int>(most.size());
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, most.data(), n, MPI_DOUBLE, MPI_MAX, mesh.comm()));
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, total.data(), n, MPI_DOUBLE, MPI_SUM, mesh.comm()));
  std::size_t i = 0;
  for (auto& [op, s] : m) {
    s.ms = s.ccl ? total[i] / mesh.size() : most[i];
    ++i;
  }
}

/// The block's shares: GEMMs (linear, grouped_gemm), attention (sdpa_sinks), the CCLs, the rest.
struct Shares {
  double gemms = 0, attention = 0, ccls = 0, other = 0;
  double compute() const { return gemms + attention + other; }
  double total() const { return compute() + ccls; }
};

Shares shares_of(const OpSums& m) {
  Shares s;
  for (const auto& [op, v] : m) {
    if (v.ccl) {
      s.ccls += v.ms;
    } else if (op == "linear" || op == "grouped_gemm") {
      s.gemms += v.ms;
    } else if (op == "sdpa_sinks") {
      s.attention += v.ms;
    } else {
      s.other += v.ms;
    }
  }
  return s;
}

/// A case's table on device 0 and its JSON.
nlohmann::json print_case(const MeshDevice& mesh, const std::string& title, const OpSums& m,
                          const Shares& s, double e2e_ms) {
  if (mesh.device_id() == 0) {
    fmt::print("\n{}\n{:<22} {:>6} {:>10} {:>7} {:>9} {:>9}\n", title, "op", "calls", "device ms",
               "share", "TFLOP/s", "GB/s");
    for (const auto& [op, v] : m) {
      fmt::print("{:<22} {:>6.0f} {:>10.4f} {:>6.1f}% {:>9.2f} {:>9.1f}{}\n", op, v.calls, v.ms,
                 s.total() > 0 ? 100 * v.ms / s.total() : 0.0,
                 v.ms > 0 ? v.flops / (v.ms * 1e9) : 0.0, v.ms > 0 ? v.bytes / (v.ms * 1e6) : 0.0,
                 v.ccl ? "  (CCL: host time, mean over devices)" : "");
    }
    fmt::print(
        "GEMMs {:.4f} ms ({:.1f}%), attention {:.4f} ms ({:.1f}%), CCLs {:.4f} ms ({:.1f}%), "
        "other kernels {:.4f} ms ({:.1f}%); the block end to end {:.4f} ms (host, slowest "
        "device)\n",
        s.gemms, 100 * s.gemms / s.total(), s.attention, 100 * s.attention / s.total(), s.ccls,
        100 * s.ccls / s.total(), s.other, 100 * s.other / s.total(), e2e_ms);
  }
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [op, v] : m) {
    ops[op] = {
        {"calls", v.calls}, {"ms", v.ms}, {"flops", v.flops}, {"bytes", v.bytes}, {"ccl", v.ccl}};
  }
  return {{"case", title},       {"ops", ops},
          {"gemms_ms", s.gemms}, {"attention_ms", s.attention},
          {"ccls_ms", s.ccls},   {"other_ms", s.other},
          {"e2e_ms", e2e_ms}};
}

/// The host time of one call after a barrier, the slowest device's.
double timed_call(const MeshDevice& mesh, const std::function<void()>& call) {
  MESHTEST_MPI(MPI_Barrier(mesh.comm()));
  const std::int64_t t0 = perf::now_ns();
  call();
  double ms = static_cast<double>(perf::now_ns() - t0) * 1e-6;
  MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, &ms, 1, MPI_DOUBLE, MPI_MAX, mesh.comm()));
  return ms;
}

std::vector<std::int64_t> parse_layers(const std::string& s) {
  std::vector<std::int64_t> out;
  for (std::size_t pos = 0; pos <= s.size();) {
    const std::size_t end = std::min(s.find(',', pos), s.size());
    std::int64_t v = -1;
    const auto [p, ec] = std::from_chars(s.data() + pos, s.data() + end, v);
    MESHTEST_CHECK(ec == std::errc{} && p == s.data() + end && v >= 0,
                   "--layers: '{}' is not a list of layer numbers (e.g. 1,0)", s);
    out.push_back(v);
    pos = end + 1;
  }
  return out;
}

bool parse(int argc, char** argv, const dist::Environment& env, Options& o) {
  po::options_description opts(
      "meshtest-bench gpt-oss --device cuda: one gpt-oss block on GPU ranks (TP over every rank: "
      "mpirun -np N, one GPU each), bf16, random weights: per-op device time (CUDA events on the "
      "stream; the CCLs' host time), TFLOP/s and GB/s, for a prefill of --tokens and a decode "
      "step of a batch of --decode sequences at position --position over KV caches, and the "
      "targets: prefill attention >= 30 % of the bf16 dense peak (causal half counted), decode "
      "attention >= 60 % of the memory bandwidth (KV bytes read), the block's compute kernels "
      "<= 1.5 x its GEMMs and attention");
  auto add = opts.add_options();
  add("help,h", "print this help");
  add("device", po::value<std::string>()->default_value("cuda"), "cuda");
  add("config", po::value(&o.config)->default_value("20b"),
      "20b (gpt-oss-20b's widths) or tiny (the tests' tiny TP config)");
  add("tokens", po::value(&o.tokens)->default_value(2048), "prefill tokens");
  add("decode", po::value(&o.decode)->default_value(64), "decode batch (sequences)");
  add("position", po::value(&o.position)->default_value(4096),
      "the decode step's position (the caches hold that many random keys and values)");
  add("layers", po::value<std::string>()->default_value("1,0"),
      "layers to run (odd: full attention; even: the sliding window)");
  add("iters", po::value(&o.iters)->default_value(3), "measured calls per case");
  add("warmup", po::value(&o.warmup)->default_value(1), "warm-up calls per case");
  add("peak-tflops", po::value(&o.peak_tflops)->default_value(0),
      "the GPU's bf16 dense peak (default: by its name, H100 / H200: 989.5)");
  add("peak-tbs", po::value(&o.peak_tbs)->default_value(0),
      "the GPU's memory bandwidth in TB/s (default: by its name, H200 4.8, H100 3.35)");
  add("json", po::value(&o.json), "also write the tables as JSON to FILE");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, opts), vm);
  po::notify(vm);
  if (vm.count("help") != 0) {
    if (env.rank() == 0) std::cout << opts;
    return false;
  }
  MESHTEST_CHECK(vm["device"].as<std::string>() == "cuda", "--device: '{}' is not cuda",
                 vm["device"].as<std::string>());
  MESHTEST_CHECK(o.config == "20b" || o.config == "tiny", "--config: '{}' is not 20b or tiny",
                 o.config);
  MESHTEST_CHECK(o.tokens >= 1 && o.decode >= 1 && o.position >= 0 && o.iters >= 1 && o.warmup >= 0,
                 "--tokens, --decode and --iters must be >= 1, --position and --warmup >= 0");
  o.layers = parse_layers(vm["layers"].as<std::string>());
  if (!o.json.empty()) tools::check_outputs_writable({o.json}, env.rank());
  return true;
}

int run(int argc, char** argv, const dist::Environment& env, tools::MpiRunState& state) {
  Options o;
  if (!parse(argc, argv, env, o)) return 0;
  if (const std::string problem = dist::gpu::gpu_binding_problem(); !problem.empty()) {
    if (env.rank() == 0) {
      fmt::print(stderr, "meshtest-bench gpt-oss: --device cuda: GPU ranks unavailable: {}\n",
                 problem);
    }
    return 2;
  }
  GptOssConfig c = o.config == "20b" ? GptOssConfig::gpt_oss_20b() : GptOssConfig::tiny_tp();
  for (const std::int64_t layer : o.layers) {
    MESHTEST_CHECK(layer < c.num_hidden_layers, "--layers: layer {} is past the model's {}", layer,
                   c.num_hidden_layers);
  }
  dist::check_tp_config(c, env.size());
  state.communicating = true;
  dist::gpu::bind_rank_to_gpu();
  const MeshDevice mesh(std::vector<int>{1, env.size()});
  const dist::TpRank tp = dist::tp_rank(mesh);
  const Peak peak = device_peak(o);
  const AttentionParams local = dist::local_attention_params(c.attention_params(0), tp.size);
  if (mesh.device_id() == 0) {
    fmt::print(
        "gpt-oss {} block on {} x {} (TP {}), bf16: hidden {}, {} q / {} kv heads of {} ({} / "
        "{} a device), {} experts top-{}, FFN {}; means of {} calls after {} warm-up; the "
        "GPU's peak: {} TFLOP/s bf16 dense, {} TB/s (0: unknown, --peak-tflops / --peak-tbs)\n",
        o.config, peak.name, mesh.size(), tp.size, c.hidden_size, c.num_attention_heads,
        c.num_key_value_heads, c.head_dim, local.num_heads, local.num_kv_heads, c.num_experts,
        c.experts_per_token, c.intermediate_size, o.iters, o.warmup, peak.tflops, peak.tbs);
  }
  gpu::Blas blas;
  nlohmann::json doc = {{"config", o.config},
                        {"devices", mesh.size()},
                        {"gpu", peak.name},
                        {"peak_tflops", peak.tflops},
                        {"peak_tbs", peak.tbs}};
  std::vector<std::string> verdicts;
  const auto verdict = [&](bool ok, const std::string& line) {
    verdicts.push_back(fmt::format("{}: {}", line, ok ? "meets" : "misses"));
  };
  for (const std::int64_t layer : o.layers) {
    const BlockWeights host = init_block_weights(c, layer, DType::bf16, RandomInit{1});
    const dist::GpuBlockShard w = dist::to_gpu(dist::shard_block_weights(
        dist::weight_source(host, layer), c, layer, {.size = tp.size, .index = tp.index}));
    const AttentionParams p = c.attention_params(layer);
    const bool full = p.sliding_window == 0;
    // Prefill: the whole sequence, one segment without a cache.
    const DeviceTensor x = DeviceTensor::from_host(
        random_normal(Shape{o.tokens, c.hidden_size}, DType::bf16, {.seed = 2}));
    const std::vector<dist::GpuCacheSegment> prefill{
        {.cache = nullptr, .first = 0, .rows = o.tokens}};
    const auto prefill_call = [&](int) {
      (void)dist::tp_transformer_block(mesh, blas, x, w, c, layer, prefill);
    };
    OpSums m = op_sums(prefill_call, o);
    aggregate(mesh, m);
    const Shares s = shares_of(m);
    const double e2e = timed_call(mesh, [&] { prefill_call(0); });
    const std::string name =
        fmt::format("prefill {} tokens, layer {} ({})", o.tokens, layer,
                    full ? "full attention" : fmt::format("window {}", p.sliding_window));
    nlohmann::json row = print_case(mesh, name, m, s, e2e);
    // The attention's FLOPs: 4 d per (query, key) pair a head computes (q·k and w·v), over the
    // pairs the mask keeps (the causal half, or the window).
    double pairs = 0;
    for (std::int64_t q = 0; q < o.tokens; ++q) {
      pairs += static_cast<double>(full ? q + 1 : std::min(q + 1, p.sliding_window));
    }
    const double attn_flops = 4.0 * static_cast<double>(local.num_heads * c.head_dim) * pairs;
    const double attn_tflops = s.attention > 0 ? attn_flops / (s.attention * 1e9) : 0;
    const double ratio = s.compute() / (s.gemms + s.attention);
    row["attention_tflops"] = attn_tflops;
    row["compute_over_gemms_attention"] = ratio;
    if (mesh.device_id() == 0) {
      fmt::print(
          "attention {:.2f} TFLOP/s (masked pairs only) = {:.1f}% of the bf16 peak; "
          "compute / (GEMMs + attention) = {:.2f}\n",
          attn_tflops, peak.tflops > 0 ? 100 * attn_tflops / peak.tflops : 0.0, ratio);
    }
    if (full && peak.tflops > 0) {
      verdict(attn_tflops >= kPrefillAttentionTarget * peak.tflops,
              fmt::format("prefill attention {} tokens >= {:.0f}% of peak ({:.1f}%)", o.tokens,
                          100 * kPrefillAttentionTarget, 100 * attn_tflops / peak.tflops));
    }
    verdict(ratio <= kBlockTarget,
            fmt::format("prefill block layer {} compute <= {} x GEMMs + attention on {} GPUs "
                        "({:.2f})",
                        layer, kBlockTarget, mesh.size(), ratio));
    doc["cases"].push_back(row);
    // Decode: one token for each of the batch's sequences at o.position + call over caches of
    // o.position random keys and values.
    const std::int64_t calls = o.warmup + o.iters + 1;
    std::vector<gpu::DeviceKvCache> caches;
    const std::int64_t kv = local.num_kv_heads, d = c.head_dim;
    const Tensor keys = random_normal(Shape{o.position, kv, d}, DType::bf16, {.seed = 3});
    const Tensor values = random_normal(Shape{o.position, kv, d}, DType::bf16, {.seed = 4});
    std::vector<std::int64_t> positions(static_cast<std::size_t>(o.position));
    for (std::int64_t i = 0; i < o.position; ++i) positions[static_cast<std::size_t>(i)] = i;
    {
      const DeviceTensor dk = DeviceTensor::from_host(keys), dv = DeviceTensor::from_host(values);
      for (std::int64_t b = 0; b < o.decode; ++b) {
        caches.emplace_back(o.position + calls, kv, d, DType::bf16);
        if (o.position > 0) caches.back().write(dk, dv, positions);
      }
    }
    const DeviceTensor xd = DeviceTensor::from_host(
        random_normal(Shape{o.decode, c.hidden_size}, DType::bf16, {.seed = 5}));
    int next = 0;
    const auto decode_call = [&](int) {
      std::vector<dist::GpuCacheSegment> step;
      for (auto& cache : caches)
        step.push_back({.cache = &cache, .first = o.position + next, .rows = 1});
      ++next;
      (void)dist::tp_transformer_block(mesh, blas, xd, w, c, layer, step);
    };
    OpSums md = op_sums(decode_call, o);
    aggregate(mesh, md);
    const Shares sd = shares_of(md);
    const double e2e_d = timed_call(mesh, [&] { decode_call(0); });
    const std::string dname =
        fmt::format("decode batch {} at position {}, layer {} ({})", o.decode, o.position, layer,
                    full ? "full attention" : fmt::format("window {}", p.sliding_window));
    nlohmann::json drow = print_case(mesh, dname, md, sd, e2e_d);
    // The attention's bytes: every sequence's keys and values it attends over, read once.
    const std::int64_t seen = full ? o.position + 1 : std::min(o.position + 1, p.sliding_window);
    const double kv_bytes = 2.0 * 2.0 * static_cast<double>(o.decode * seen * kv * d);
    const double tbs = sd.attention > 0 ? kv_bytes / (sd.attention * 1e9) : 0;
    drow["attention_tbs"] = tbs;
    if (mesh.device_id() == 0) {
      fmt::print(
          "attention reads {:.1f} MB of keys and values: {:.2f} TB/s = {:.1f}% of the "
          "memory bandwidth\n",
          kv_bytes * 1e-6, tbs, peak.tbs > 0 ? 100 * tbs / peak.tbs : 0.0);
    }
    if (full && peak.tbs > 0) {
      verdict(
          tbs >= kDecodeAttentionTarget * peak.tbs,
          fmt::format("decode attention batch {} at {} >= {:.0f}% of bandwidth ({:.1f}%)", o.decode,
                      o.position, 100 * kDecodeAttentionTarget, 100 * tbs / peak.tbs));
    }
    doc["cases"].push_back(drow);
  }
  if (mesh.device_id() == 0) {
    fmt::print("\ntargets:\n");
    for (const std::string& v : verdicts) fmt::print("  {}\n", v);
    doc["targets"] = verdicts;
    if (!o.json.empty()) {
      const std::string text = doc.dump(2) + "\n";
      const std::span<const std::byte> part(reinterpret_cast<const std::byte*>(text.data()),
                                            text.size());
      write_file_atomic(o.json, std::span(&part, 1));
      fmt::print("wrote {}\n", o.json);
    }
  }
  return 0;
}

}  // namespace gpt_oss_cuda

int gpt_oss_cuda_main(int argc, char** argv) {
  return tools::mpi_subcommand("meshtest-bench gpt-oss", argc, argv, gpt_oss_cuda::run);
}

}  // namespace meshtest::bench
