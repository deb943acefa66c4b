// meshtest-bench fused: the fused ops against their reference sequences, single
// device. Sections (--parts, default all):
//   experts   (bench/fused_experts.hpp): fused experts vs the MLP block's sequence and a dense
//             gather at T = 1024, E = 32, k = 4 (hidden = I = 512 by default);
//   sdpa      (bench/fused_attention.hpp): sdpa_sinks vs sdpa at prefill 1024 (--long adds
//             8192), gpt-oss-20b's attention shapes, sliding window 128 and full causal; time
//             and peak heap inside the call;
//   qkv_rope  (bench/fused_attention.hpp): qkv_rope vs linear + split_qkv + rope at prefill
//             1024, hidden 2880;
//   trace     (bench/fused_trace.hpp): qkv_rope -> sdpa_sinks eager vs perf::Trace replay,
//             total kernel duration and op-to-op latency, at decode 1 and prefill 128.
#include <fmt/format.h>
#include <Eigen/Core>
#include <boost/program_options.hpp>

#include <cstdio>
#include <set>
#include <sstream>
#include <string>

#include "bench/bench_common.hpp"
#include "bench/fused_attention.hpp"
#include "bench/fused_experts.hpp"
#include "bench/fused_trace.hpp"
#include "tools/subcommand.hpp"

namespace meshtest::tools {
namespace bench_fused {

namespace po = boost::program_options;

/// The sections named by --parts ("all" or a comma list of experts, sdpa, qkv_rope, trace).
std::set<std::string> parse_parts(const std::string& parts) {
  if (parts == "all") return {"experts", "sdpa", "qkv_rope", "trace"};
  std::set<std::string> out;
  std::stringstream in(parts);
  for (std::string p; std::getline(in, p, ',');) {
    MESHTEST_CHECK(p == "experts" || p == "sdpa" || p == "qkv_rope" || p == "trace",
                   "--parts: '{}' is not experts, sdpa, qkv_rope or trace (or all)", p);
    out.insert(p);
  }
  MESHTEST_CHECK(!out.empty(), "--parts: empty");
  return out;
}

int bench_fused_main(int argc, char** argv) {
  bench::ExpertsBenchOptions o;
  bench::AttentionBenchOptions a;
  std::string dtype = "f32", parts = "all";
  bool no_dense = false, long_run = false;
  std::int64_t trace_tokens = 128;
  int trace_iters = 20;
  po::options_description opts(
      "meshtest-bench fused: the fused ops against their reference sequences, "
      "single device, random weights; prints the times, the ratios and the issue-12 targets. "
      "Exit 1 when a fused output disagrees with its reference.\n"
      "  experts:  router, grouped GEMMs over each expert's tokens, weighted sum vs the MLP "
      "block's op sequence and a dense-gather reference (target >= 2 x faster than the dense "
      "gather at T 1024, E 32, k 4);\n"
      "  sdpa:     sdpa_sinks (flash-style) vs sdpa at prefill 1024 (--long: also 8192, minutes "
      "on 2 cores), sliding window and full causal: time and peak heap inside the call (target: "
      "faster, peak O(T d) instead of O(T^2));\n"
      "  qkv_rope: qkv_rope vs linear + split_qkv + rope at prefill 1024 (target >= 1.1 x);\n"
      "  trace:    qkv_rope -> sdpa_sinks called eagerly vs replayed from a perf::Trace, at "
      "decode 1 and prefill --trace-tokens: total kernel duration and op-to-op latency between "
      "signposts (target: replay lowers the op-to-op latency).\n"
      "The default run (f32) takes about 30 s on 2 shared cores.\nOptions");
  auto add = opts.add_options();
  add("help,h", "print this help");
  add("parts", po::value(&parts)->default_value(parts),
      "sections to run: all, or a comma list of experts, sdpa, qkv_rope, trace");
  add("dtype", po::value(&dtype)->default_value(dtype), "f32, f64 or bf16 (every section)");
  add("warmup", po::value(&o.warmup)->default_value(o.warmup), "warm-up calls per figure");
  add("seed", po::value(&o.seed)->default_value(o.seed), "seed of the weights and inputs");
  add("tokens", po::value(&o.tokens)->default_value(o.tokens), "experts: tokens T (prefill)");
  add("hidden", po::value(&o.hidden)->default_value(o.hidden),
      "experts: hidden size (gpt-oss-20b: 2880)");
  add("intermediate", po::value(&o.intermediate)->default_value(o.intermediate),
      "experts: expert FFN width I (gpt-oss-20b: 2880)");
  add("experts", po::value(&o.experts)->default_value(o.experts), "experts: experts E");
  add("k", po::value(&o.k)->default_value(o.k), "experts: experts per token (1 .. E)");
  add("iters", po::value(&o.iters)->default_value(o.iters), "experts: measured calls per figure");
  add("no-dense", po::bool_switch(&no_dense), "experts: skip the dense-gather reference");
  add("attn-tokens", po::value(&a.qkv_tokens)->default_value(a.qkv_tokens),
      "sdpa and qkv_rope: prefill length T");
  add("trace-tokens", po::value(&trace_tokens)->default_value(trace_tokens),
      "trace: the prefill length (decode 1 runs too)");
  add("trace-iters", po::value(&trace_iters)->default_value(trace_iters),
      "trace: measured calls per mode");
  add("long", po::bool_switch(&long_run), "sdpa: also prefill 8192 (slow: minutes)");
  add("heads", po::value(&a.heads)->default_value(a.heads), "sdpa, qkv_rope: query heads");
  add("kv-heads", po::value(&a.kv_heads)->default_value(a.kv_heads),
      "sdpa, qkv_rope: kv heads (divides --heads)");
  add("head-dim", po::value(&a.head_dim)->default_value(a.head_dim),
      "sdpa, qkv_rope: head_dim (even)");
  add("window", po::value(&a.window)->default_value(a.window),
      "sdpa: sliding window (0: full causal only; each T also runs full causal)");
  add("qkv-hidden", po::value(&a.hidden)->default_value(a.hidden), "qkv_rope: hidden size");
  add("qkv-row-block", po::value(&a.qkv_row_block)->default_value(a.qkv_row_block),
      "qkv_rope: tokens per GEMM panel (QkvRopeOptions::row_block)");
  add("qkv-column-block", po::value(&a.qkv_column_block)->default_value(a.qkv_column_block),
      "qkv_rope: weight columns per block, whole heads (QkvRopeOptions::column_block)");
  add("attn-iters", po::value(&a.iters)->default_value(a.iters),
      "sdpa, qkv_rope: measured calls per figure");
  std::set<std::string> run;
  const int parsed = bench::parse_options("fused", argc, argv, opts, [&] {
    run = parse_parts(parts);
    MESHTEST_CHECK(dtype == "f32" || dtype == "f64" || dtype == "bf16",
                   "--dtype: '{}' is not f32, f64 or bf16", dtype);
    MESHTEST_CHECK(o.tokens >= 1 && o.hidden >= 1 && o.intermediate >= 1 && o.experts >= 1,
                   "--tokens, --hidden, --intermediate and --experts must be >= 1");
    MESHTEST_CHECK(o.k >= 1 && o.k <= o.experts, "--k: {} is outside 1 .. {} (--experts)", o.k,
                   o.experts);
    MESHTEST_CHECK(o.iters >= 1 && o.warmup >= 0, "--iters must be >= 1 and --warmup >= 0");
    a.sdpa_tokens.assign(1, a.qkv_tokens);  // (= {x}: GCC 13's -Warray-bounds misfires under ASan)
    if (long_run) a.sdpa_tokens.push_back(8192);
    a.warmup = o.warmup;
    a.seed = o.seed;
    bench::check_attention_options(a);
    MESHTEST_CHECK(trace_tokens >= 1 && trace_iters >= 1,
                   "--trace-tokens and --trace-iters must be >= 1");
  });
  if (parsed != 0) return parsed == 1 ? 0 : 2;
  // Line-buffered: each figure shows as it is measured, also in a log file (a --long run takes
  // minutes).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // Every GEMM's speed, and so qkv_rope's ratio, follows the vector set Eigen was built with.
  fmt::print("Eigen SIMD: {} ({} build)\n", Eigen::SimdInstructionSetsInUse(),
             MESHTEST_NATIVE_BUILD ? "-march=native" : "default: no -march");
  o.dtype = dtype == "f32" ? DType::f32 : dtype == "f64" ? DType::f64 : DType::bf16;
  a.dtype = o.dtype;
  o.dense = !no_dense;
  bool agree = true;
  if (run.contains("experts")) agree = bench::experts_section(o).outputs_agree && agree;
  if (run.contains("sdpa")) agree = bench::sdpa_section(a) && agree;
  if (run.contains("qkv_rope")) agree = bench::qkv_rope_section(a) && agree;
  if (run.contains("trace")) {
    // trace_vs_eager throws when a replay differs from the eager call (exit 1 by the runner).
    for (const std::int64_t t : {std::int64_t{1}, trace_tokens}) {
      fmt::print("\ntrace vs eager: qkv_rope -> sdpa_sinks, T = {}, {}, {} calls per mode\n", t,
                 dtype, trace_iters);
      const bench::TraceVsEager r = bench::trace_vs_eager(
          {.tokens = t, .dtype = o.dtype, .warmup = o.warmup, .iterations = trace_iters});
      fmt::print(
          "trace target (replay lowers the total op-to-op latency) at T = {}: {} ({:.3f} x "
          "eager's)\n",
          t, r.latency_ratio < 1 ? "meets" : "misses", r.latency_ratio);
    }
  }
  fmt::print("fused: every section's outputs agree with its reference: {}\n",
             agree ? "PASS" : "FAIL");
  return agree ? 0 : 1;
}

const RegisterSubcommand reg{
    {"fused",
     "fused ops vs their reference sequences (experts, sdpa_sinks, qkv_rope: times, ratios, "
     "peak memory)",
     &bench_fused_main}};

}  // namespace bench_fused
}  // namespace meshtest::tools
