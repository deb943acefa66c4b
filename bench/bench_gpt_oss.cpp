// meshtest-bench gpt-oss: per-op time and GFLOP/s of the gpt-oss attention and MLP blocks at the
// 20b widths with short sequences, beside Eigen's GEMM on the same shapes (single device).
#include <fmt/format.h>
#include <boost/program_options.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "bench/gpt_oss_cuda.hpp"
#include "src/core/random.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/ops/attention.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/moe/moe.hpp"
#include "src/perf/profiler.hpp"
#include "tools/subcommand.hpp"

namespace meshtest::tools {
namespace bench_gpt_oss {

namespace po = boost::program_options;

/// One GEMM C[m, n] = A[m, k] · B[n, k]ᵀ (the layout of linear).
using Gemm = std::array<std::int64_t, 3>;

struct Options {
  std::vector<std::int64_t> tokens;
  std::int64_t experts = 4;
  int warmup = 1, iters = 3;
};

/// One op of a block, measured: the median duration over the iterations.
struct OpRow {
  std::string op, shape;
  double us = 0, flops = 0;
  std::vector<Gemm> gemms;  ///< the op's GEMMs (empty: no GEMM baseline)
  double eigen_us = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Median seconds of `iters` runs of every GEMM in `gemms` with Eigen (f32, preallocated).
double time_gemms(const std::vector<Gemm>& gemms, const Options& o) {
  std::map<Gemm, std::array<RowMatrix<float>, 3>> mats;
  for (const Gemm& g : gemms) {
    auto& m = mats[g];
    if (m[0].size() != 0) continue;
    m[0] = RowMatrix<float>::Random(g[0], g[1]);
    m[1] = RowMatrix<float>::Random(g[2], g[1]);
    m[2] = RowMatrix<float>(g[0], g[2]);
  }
  std::vector<double> secs;
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    const std::int64_t t0 = perf::now_ns();
    for (const Gemm& g : gemms) {
      auto& m = mats[g];
      m[2].noalias() = m[0] * m[1].transpose();
    }
    if (it >= o.warmup) secs.push_back(static_cast<double>(perf::now_ns() - t0) * 1e-9);
  }
  return median(secs);
}

/// The GEMMs of a recorded op, from its input shapes (and the experts' token counts).
std::vector<Gemm> gemms_of(const perf::OpRecord& r, const std::vector<std::int64_t>& per_expert) {
  const auto& in = r.inputs;
  if (r.op_code == "linear") {
    const Shape& x = in[0].shape;
    return {{x.numel() / x[x.rank() - 1], in[1].shape[1], in[1].shape[0]}};
  }
  if (r.op_code == "sdpa") {  // per head: q·kᵀ [Tq, d] x [Tk, d]ᵀ, then w·v [Tq, Tk] x [d, Tk]ᵀ
    const Shape& q = in[0].shape;
    const std::int64_t tk = in[1].shape[0];
    std::vector<Gemm> g;
    for (std::int64_t h = 0; h < q[1] * q[2]; ++h) {
      g.push_back({q[0], q[3], tk});
      g.push_back({q[0], tk, q[3]});
    }
    return g;
  }
  if (r.op_code ==
      "moe_experts") {  // per expert with n tokens: [n, H] x [2I, H]ᵀ, [n, I] x [H, I]ᵀ
    const std::int64_t two_i = in[1].shape[1], hidden = in[1].shape[2];
    std::vector<Gemm> g;
    for (const std::int64_t n : per_expert) {
      if (n == 0) continue;
      g.push_back({n, hidden, two_i});
      g.push_back({n, two_i / 2, hidden});
    }
    return g;
  }
  return {};
}

/// Runs `block` warmup + iters times under the profiler; one row per op of an iteration.
template <class F>
std::vector<OpRow> measure(F&& block, const std::vector<std::int64_t>& per_expert,
                           const Options& o) {
  std::vector<perf::OpRecord> recs;
  {
    perf::Session session;
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      if (it == o.warmup) perf::clear();
      block();
    }
    recs = perf::records();
  }
  const std::size_t per_iter = recs.size() / static_cast<std::size_t>(o.iters);
  std::vector<OpRow> rows(per_iter);
  for (std::size_t i = 0; i < per_iter; ++i) {
    std::vector<double> us;
    for (int it = 0; it < o.iters; ++it) {
      us.push_back(static_cast<double>(recs[it * per_iter + i].duration_ns()) * 1e-3);
    }
    const perf::OpRecord& r = recs[i];
    rows[i] = {.op = r.op_code,
               .shape = r.inputs.empty() ? "" : r.inputs[0].shape.str(),
               .us = median(us),
               .flops = r.flops,
               .gemms = gemms_of(r, per_expert),
               .eigen_us = 0};
    if (!rows[i].gemms.empty()) rows[i].eigen_us = time_gemms(rows[i].gemms, o) * 1e6;
  }
  return rows;
}

std::vector<std::int64_t> parse_list(const std::string& s) {
  std::vector<std::int64_t> out;
  for (std::size_t pos = 0; pos <= s.size();) {
    const std::size_t end = std::min(s.find(',', pos), s.size());
    std::int64_t v = 0;
    const auto [p, ec] = std::from_chars(s.data() + pos, s.data() + end, v);
    MESHTEST_CHECK(ec == std::errc{} && p == s.data() + end && v >= 1,
                   "--tokens: '{}' is not a list of positive integers (e.g. 1,8,32)", s);
    out.push_back(v);
    pos = end + 1;
  }
  return out;
}

void print_rows(std::int64_t t, const std::string& block, const std::vector<OpRow>& rows) {
  double us = 0, flops = 0;
  for (const OpRow& r : rows) {
    const double gflops = r.us > 0 ? r.flops / (r.us * 1e3) : 0;
    std::string eigen = fmt::format("{:>10} {:>9} {:>7}", "-", "-", "-");
    if (!r.gemms.empty()) {
      double gemm_flops = 0;
      for (const Gemm& g : r.gemms) gemm_flops += 2.0 * g[0] * g[1] * g[2];
      const double eg = gemm_flops / (r.eigen_us * 1e3);
      eigen = fmt::format("{:>10.1f} {:>9.2f} {:>7.2f}", r.eigen_us, eg, gflops / eg);
    }
    fmt::print("{:>3} {:<5} {:<12} {:<18} {:>10.1f} {:>9.2f} {:>5} {}\n", t, block, r.op, r.shape,
               r.us, gflops, r.gemms.size(), eigen);
    us += r.us;
    flops += r.flops;
  }
  fmt::print("{:>3} {:<5} {:<12} {:<18} {:>10.1f} {:>9.2f}\n", t, block, "(block)", "", us,
             us > 0 ? flops / (us * 1e3) : 0);
}

/// Whether the command line asks for --device cuda (the GPU tables, their own options).
bool wants_cuda(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device=cuda" ||
        (a == "--device" && i + 1 < argc && std::string(argv[i + 1]) == "cuda")) {
      return true;
    }
  }
  return false;
}

int bench_main(int argc, char** argv) {
  if (wants_cuda(argc, argv)) {
#if MESHTEST_BENCH_CUDA
    return bench::gpt_oss_cuda_main(argc, argv);
#else
    fmt::print(stderr,
               "meshtest-bench gpt-oss: --device cuda: this meshtest-bench was built without the "
               "GPU side (configure with -DMESHTEST_CUDA=ON; docs/gpu.md)\n");
    return 2;
#endif
  }
  po::options_description opts(
      "meshtest-bench gpt-oss: per-op time and GFLOP/s of the gpt-oss attention and MLP blocks "
      "at the 20b widths (hidden 2880, 64 q / 8 kv heads of 64, FFN 2880, top-4), f32, random "
      "weights, beside Eigen's f32 GEMM on the same shapes");
  auto add = opts.add_options();
  add("help,h", "print this help");
  add("device", po::value<std::string>()->default_value("cpu"),
      "cpu, or cuda: one block on GPU ranks under mpirun, with its own options (--device cuda "
      "--help; a build with the GPU side)");
  add("tokens", po::value<std::string>()->default_value("1,8,32"), "sequence lengths T");
  add("experts", po::value<std::int64_t>()->default_value(4),
      "experts held (20b has 32; each token uses min(4, experts) of them, as 20b's top-4)");
  add("iters", po::value<int>()->default_value(3), "measured iterations (median reported)");
  add("warmup", po::value<int>()->default_value(1), "warm-up iterations");
  Options o;
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << opts;
      return 0;
    }
    MESHTEST_CHECK(vm["device"].as<std::string>() == "cpu", "--device: '{}' is not cpu or cuda",
                   vm["device"].as<std::string>());
    o.tokens = parse_list(vm["tokens"].as<std::string>());
    o.experts = vm["experts"].as<std::int64_t>();
    o.iters = vm["iters"].as<int>();
    o.warmup = vm["warmup"].as<int>();
    MESHTEST_CHECK(o.experts >= 1 && o.iters >= 1 && o.warmup >= 0,
                   "--experts and --iters must be >= 1 and --warmup >= 0; got {}, {}, {}",
                   o.experts, o.iters, o.warmup);
  } catch (const std::exception& e) {
    fmt::print(stderr, "meshtest-bench gpt-oss: error: {}\n", e.what());
    return 2;
  }
  GptOssConfig c = GptOssConfig::gpt_oss_20b();
  c.num_experts = o.experts;
  c.experts_per_token = std::min<std::int64_t>(4, o.experts);
  const BlockWeights w = init_block_weights(c, 1, DType::f32, RandomInit{1});
  fmt::print(
      "gpt-oss-20b widths: hidden {}, {} q / {} kv heads of {}, {} experts (top-{}), FFN {}; "
      "f32; layer 1 (no window); median of {} iterations after {} warm-up\n"
      "GFLOP/s = the op's counted flops / its time; Eigen = f32 GEMM (C = A Bᵀ) of the op's "
      "GEMM shapes, preallocated; ratio = op GFLOP/s / Eigen GFLOP/s\n\n",
      c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.num_experts,
      c.experts_per_token, c.intermediate_size, o.iters, o.warmup);
  fmt::print("{:>3} {:<5} {:<12} {:<18} {:>10} {:>9} {:>5} {:>10} {:>9} {:>7}\n", "T", "block",
             "op", "input 0", "op us", "GFLOP/s", "gemms", "Eigen us", "GFLOP/s", "ratio");
  for (const std::int64_t t : o.tokens) {
    const Tensor x = random_normal(Shape{t, c.hidden_size}, DType::f32, {.seed = 2});
    const AttentionParams ap = c.attention_params(1);
    const MoeParams mp = c.moe_params();
    print_rows(t, "attn", measure([&] { attention_block(x, w.attn, ap); }, {}, o));
    // The experts' token counts, from the same (deterministic) routing mlp_block computes.
    const Routing r =
        route_top_k(linear(rms_norm(x, w.mlp.norm_scale), w.mlp.gate_weight, w.mlp.gate_bias),
                    mp.experts_per_token);
    std::vector<std::int64_t> per_expert(static_cast<std::size_t>(c.num_experts), 0);
    for (const std::int64_t e : r.experts) ++per_expert[static_cast<std::size_t>(e)];
    print_rows(t, "mlp", measure([&] { mlp_block(x, w.mlp, mp); }, per_expert, o));
  }
  return 0;
}

const RegisterSubcommand reg{
    {"gpt-oss", "per-op time and GFLOP/s of gpt-oss attention and MLP at 20b widths vs Eigen GEMM",
     &bench_main}};

}  // namespace bench_gpt_oss
}  // namespace meshtest::tools
