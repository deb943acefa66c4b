// meshtest-bench fused: the fused ops of issue 12 against their reference sequences, single
// device. Section "experts" (bench/fused_experts.hpp): fused experts vs the MLP block's sequence
// and vs a dense-gather reference at T = 1024, E = 32, k = 4 (hidden = I = 512 by default, 7 to
// 18 s on 2 shared cores; --hidden 2880 --intermediate 2880 for gpt-oss-20b's widths).
#include <fmt/format.h>
#include <boost/program_options.hpp>

#include <string>

#include "bench/bench_common.hpp"
#include "bench/fused_experts.hpp"
#include "tools/subcommand.hpp"

namespace meshtest::tools {
namespace {

namespace po = boost::program_options;

int bench_fused_main(int argc, char** argv) {
  bench::ExpertsBenchOptions o;
  std::string dtype = "f32";
  bool no_dense = false;
  po::options_description opts(
      "meshtest-bench fused: the fused experts op (router, grouped GEMMs over each expert's "
      "tokens, weighted sum) against the MLP block's op sequence and against a dense-gather "
      "reference (each token through its k experts alone), single device, random weights; "
      "prints the times, the ratios and the issue-12 target (>= 2 x faster than the dense "
      "gather at T 1024, E 32, k 4). Exit 1 when the outputs disagree.\nOptions");
  auto add = opts.add_options();
  add("help,h", "print this help");
  add("tokens", po::value(&o.tokens)->default_value(o.tokens), "tokens T (prefill)");
  add("hidden", po::value(&o.hidden)->default_value(o.hidden), "hidden size (gpt-oss-20b: 2880)");
  add("intermediate", po::value(&o.intermediate)->default_value(o.intermediate),
      "expert FFN width I (gpt-oss-20b: 2880)");
  add("experts", po::value(&o.experts)->default_value(o.experts), "experts E");
  add("k", po::value(&o.k)->default_value(o.k), "experts per token (1 .. E)");
  add("dtype", po::value(&dtype)->default_value(dtype), "f32, f64 or bf16");
  add("iters", po::value(&o.iters)->default_value(o.iters), "measured calls per figure");
  add("warmup", po::value(&o.warmup)->default_value(o.warmup), "warm-up calls per figure");
  add("no-dense", po::bool_switch(&no_dense), "skip the dense-gather reference");
  add("seed", po::value(&o.seed)->default_value(o.seed), "seed of the weights and tokens");
  const int parsed = bench::parse_options("fused", argc, argv, opts, [&] {
    MESHTEST_CHECK(dtype == "f32" || dtype == "f64" || dtype == "bf16",
                   "--dtype: '{}' is not f32, f64 or bf16", dtype);
    MESHTEST_CHECK(o.tokens >= 1 && o.hidden >= 1 && o.intermediate >= 1 && o.experts >= 1,
                   "--tokens, --hidden, --intermediate and --experts must be >= 1");
    MESHTEST_CHECK(o.k >= 1 && o.k <= o.experts, "--k: {} is outside 1 .. {} (--experts)", o.k,
                   o.experts);
    MESHTEST_CHECK(o.iters >= 1 && o.warmup >= 0, "--iters must be >= 1 and --warmup >= 0");
  });
  if (parsed != 0) return parsed == 1 ? 0 : 2;
  o.dtype = dtype == "f32" ? DType::f32 : dtype == "f64" ? DType::f64 : DType::bf16;
  o.dense = !no_dense;
  const bench::ExpertsBenchResult r = bench::experts_section(o);
  return r.outputs_agree ? 0 : 1;
}

const RegisterSubcommand reg{
    {"fused",
     "fused ops vs their reference sequences (experts: vs the MLP block and a dense gather)",
     &bench_fused_main}};

}  // namespace
}  // namespace meshtest::tools
