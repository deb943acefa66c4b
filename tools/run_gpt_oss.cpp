// meshtest-run gpt-oss: the logits of a gpt-oss checkpoint for given tokens, on one device or
// tensor parallel on a mesh, optionally with the MoE MLPs expert parallel on one mesh axis
// (./launch/meshtest run -np N build/bin/meshtest-run gpt-oss ... [--ep-axis A]).
#include <fmt/format.h>
#include <mpi.h>
#include <boost/program_options.hpp>

#include <charconv>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "dist/mesh/environment.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "dist/parallel/ep_transformer.hpp"
#include "dist/parallel/tensor_parallel.hpp"
#include "src/core/npy.hpp"
#include "src/models/checkpoint.hpp"
#include "tools/mpi_subcommand.hpp"
#include "tools/subcommand.hpp"

namespace meshtest::tools {
namespace run_gpt_oss {

namespace po = boost::program_options;
constexpr std::string_view kName = "meshtest-run gpt-oss";

/// Parses "1,2,3": T >= 1 integers; names the bad item.
std::vector<std::int64_t> parse_tokens(const std::string& s) {
  std::vector<std::int64_t> out;
  std::size_t pos = 0;
  while (pos <= s.size() && !s.empty()) {
    const std::size_t end = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, end - pos);
    std::int64_t v = 0;
    const auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    MESHTEST_CHECK(!item.empty() && ec == std::errc{} && p == item.data() + item.size(),
                   "--tokens: item {} ('{}') is not an integer token id (expected e.g. 1,2,3)",
                   out.size(), item);
    out.push_back(v);
    pos = end + 1;
  }
  MESHTEST_CHECK(!out.empty(), "--tokens: no tokens given (T = 0), expected T >= 1 ids");
  return out;
}

/// Parses "RxC" (or "N" for 1 x N).
std::vector<int> parse_mesh(const std::string& s) {
  int r = 0, c = 0;
  char x = 0, extra = 0;
  if (std::sscanf(s.c_str(), "%d%c%d%c", &r, &x, &c, &extra) == 3 && (x == 'x' || x == 'X') &&
      r > 0 && c > 0) {
    return {r, c};
  }
  if (std::sscanf(s.c_str(), "%d%c", &r, &extra) == 1 && r > 0) return {1, r};
  fail("--mesh expects RxC (e.g. 2x4) or N with positive R, C, N; got '{}'", s);
}

struct Args {
  std::string checkpoint, out, mesh, make_tiny;
  std::uint64_t seed = 0;         ///< --make-tiny-checkpoint's random weights
  DType tiny_dtype = DType::f32;  ///< --make-tiny-checkpoint's stored dtype
  std::vector<std::int64_t> tokens;
  std::int64_t layers = -1;
  int ep_axis = -1;    ///< -1: tensor parallel only
  bool fused = false;  ///< the blocks' fused ops (TransformerOptions::fused)
  DType dtype = DType::bf16;
};

/// Parses and checks the options; returns false after --help.
bool parse(int argc, char** argv, int rank, Args& a) {
  po::options_description opts(
      "meshtest-run gpt-oss: logits [T, vocab] (f32 .npy) of a gpt-oss checkpoint for the given "
      "tokens, on one device or tensor parallel (TP on mesh axis 1, tokens split on axis 0), the "
      "MoE MLPs optionally expert parallel (--ep-axis)");
  auto add = opts.add_options();
  add("help,h", "print this help");
  add("checkpoint", po::value<std::string>(&a.checkpoint),
      "checkpoint directory: config.json + *.safetensors (MXFP4 expert weights allowed)");
  add("tokens", po::value<std::string>(), "comma-separated token ids, e.g. 1,2,3");
  add("out", po::value<std::string>(&a.out), "output .npy of the logits (written by rank 0)");
  add("layers", po::value<std::int64_t>(&a.layers)->default_value(-1),
      "run only the first N blocks (-1: all)");
  add("mesh", po::value<std::string>(&a.mesh),
      "mesh RxC (R*C = number of ranks); default 1xN over all ranks");
  add("ep-axis", po::value<int>(&a.ep_axis)->default_value(-1),
      "run the MoE MLPs expert parallel with the experts (contiguous blocks) and the tokens on "
      "mesh axis 0 or 1, tensor parallel on the other; -1: tensor parallel only (TP on axis 1)");
  add("make-tiny-checkpoint", po::value<std::string>(&a.make_tiny),
      "write a tiny random checkpoint (GptOssConfig::tiny_tp, MXFP4 experts) to this "
      "directory and exit (rank 0), to try the command");
  add("seed", po::value<std::uint64_t>(&a.seed)->default_value(0),
      "--make-tiny-checkpoint: the seed of its random weights");
  add("tiny-dtype", po::value<std::string>()->default_value("f32"),
      "--make-tiny-checkpoint: the dtype its weights are stored in, f32 or bf16 (bf16: values "
      "that a bf16 model, such as the published one, loads exactly)");
  add("fused", po::bool_switch(&a.fused),
      "run the blocks' fused ops (qkv_rope, sdpa_sinks) in place of their unfused sequences; "
      "off: the reference numerics");
  add("dtype", po::value<std::string>()->default_value("bf16"),
      "bf16: bf16 weights and activations, f32 inside norms, RoPE and softmax (as the reference);"
      " f32: weights upcast, every activation f32");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, opts), vm);
  po::notify(vm);
  if (vm.count("help")) {
    if (rank == 0) {
      std::cout << opts
                << "\nExample: ./launch/meshtest run -np 4 build/bin/meshtest-run gpt-oss "
                   "--checkpoint DIR --tokens 1,2,3 --out logits.npy --mesh 2x2\n"
                   "Exit status: 0 ok, 2 bad input (clear message), 3 a failure while running.\n";
    }
    return false;
  }
  if (!a.make_tiny.empty()) {
    const std::string tiny = vm["tiny-dtype"].as<std::string>();
    MESHTEST_CHECK(tiny == "bf16" || tiny == "f32", "--tiny-dtype is '{}', expected bf16 or f32",
                   tiny);
    a.tiny_dtype = tiny == "bf16" ? DType::bf16 : DType::f32;
    return true;
  }
  for (const char* required : {"checkpoint", "tokens", "out"}) {
    MESHTEST_CHECK(vm.count(required), "--{} is required (see --help)", required);
  }
  a.tokens = parse_tokens(vm["tokens"].as<std::string>());
  const std::string dtype = vm["dtype"].as<std::string>();
  MESHTEST_CHECK(dtype == "bf16" || dtype == "f32", "--dtype is '{}', expected bf16 or f32", dtype);
  a.dtype = dtype == "bf16" ? DType::bf16 : DType::f32;
  MESHTEST_CHECK(a.ep_axis >= -1 && a.ep_axis <= 1,
                 "--ep-axis is {}, expected 0 or 1 (a mesh axis) or -1 (no expert parallelism)",
                 a.ep_axis);
  return true;
}

/// Reads this rank's TP shard (the same files on every rank: a bad checkpoint fails alike
/// everywhere, before any CCL) and runs the TP model; `secs`: the time of the run.
Tensor run_tp(const dist::MeshDevice& mesh, const Args& a, const GptOssConfig& c,
              const dist::TpOptions& tp, MpiRunState& state, double& secs) {
  const dist::TpTransformerWeights w =
      dist::read_tp_checkpoint(a.checkpoint, c, a.dtype, dist::tp_rank(mesh, tp), a.layers);
  state.communicating = true;  // every rank checked the same input
  const double t0 = MPI_Wtime();
  Tensor local =
      dist::tp_transformer(mesh, a.tokens, w, c, {.num_layers = a.layers, .fused = a.fused}, tp);
  secs = MPI_Wtime() - t0;
  return local;
}

/// As run_tp with the experts placed contiguously on axis a.ep_axis (ep_transformer).
Tensor run_ep(const dist::MeshDevice& mesh, const Args& a, const GptOssConfig& c,
              MpiRunState& state, double& secs) {
  const dist::EpOptions o{.ep_axis = a.ep_axis};
  const dist::TpRank ep = dist::ep_rank(mesh, o);
  const dist::EpTransformerWeights w = dist::read_ep_checkpoint(
      a.checkpoint, c, a.dtype,
      dist::place_experts(dist::ExpertAssignment::Contiguous, c.num_experts, ep.size), ep.index,
      dist::ep_tp_rank(mesh, o), a.layers);
  state.communicating = true;  // every rank checked the same input
  const double t0 = MPI_Wtime();
  Tensor local =
      dist::ep_transformer(mesh, a.tokens, w, c, {.num_layers = a.layers, .fused = a.fused}, o);
  secs = MPI_Wtime() - t0;
  return local;
}

int run(int argc, char** argv, const dist::Environment& env, MpiRunState& state) {
  Args a;
  if (!parse(argc, argv, env.rank(), a)) return 0;
  if (!a.make_tiny.empty()) {
    if (env.rank() == 0) {
      const GptOssConfig c = GptOssConfig::tiny_tp();
      write_checkpoint(a.make_tiny, c,
                       init_transformer_weights(c, a.tiny_dtype, RandomInit{a.seed}));
      fmt::print("{}: wrote a tiny random checkpoint (vocab {}, {} layers, {}, seed {}) to {}\n",
                 kName, c.vocab_size, c.num_hidden_layers, a.tiny_dtype, a.seed, a.make_tiny);
    }
    return 0;
  }
  const std::vector<int> shape =
      a.mesh.empty() ? std::vector<int>{1, env.size()} : parse_mesh(a.mesh);
  MESHTEST_CHECK(shape[0] * shape[1] == env.size(),
                 "--mesh {} has {} devices but {} ranks are running (use -np {} or another mesh)",
                 a.mesh, shape[0] * shape[1], env.size(), shape[0] * shape[1]);
  const GptOssConfig c = read_config(a.checkpoint);
  MESHTEST_CHECK(a.layers >= -1 && a.layers <= c.num_hidden_layers,
                 "--layers is {}, expected -1 (all) or 0 .. {} (num_hidden_layers)", a.layers,
                 c.num_hidden_layers);
  for (std::size_t i = 0; i < a.tokens.size(); ++i) {
    MESHTEST_CHECK(a.tokens[i] >= 0 && a.tokens[i] < c.vocab_size,
                   "--tokens: token {} at position {} is outside the vocabulary [0, {})",
                   a.tokens[i], i, c.vocab_size);
  }
  check_outputs_writable({a.out}, env.rank());
  const dist::MeshDevice mesh(shape);
  const dist::TpOptions tp{.tp_axis = a.ep_axis < 0 ? 1 : 1 - a.ep_axis};
  double secs = 0;
  const Tensor local =
      a.ep_axis < 0 ? run_tp(mesh, a, c, tp, state, secs) : run_ep(mesh, a, c, state, secs);
  const Tensor logits =
      dist::gather_full(local, mesh, dist::tp_logits_placements(tp)).astype(DType::f32);
  if (env.rank() == 0) {
    write_npy(a.out, logits);
    fmt::print("{}: wrote logits {} to {} (mesh {}{}{}, dtype {}, {} of {} layers, {:.3f} s)\n",
               kName, describe(logits), a.out, mesh.str(),
               a.ep_axis < 0 ? std::string() : fmt::format(", experts on axis {}", a.ep_axis),
               a.fused ? ", fused ops" : "", dtype_name(a.dtype),
               a.layers < 0 ? c.num_hidden_layers : a.layers, c.num_hidden_layers, secs);
  }
  return 0;
}

int gpt_oss_main(int argc, char** argv) { return mpi_subcommand(kName, argc, argv, run); }

const RegisterSubcommand reg{
    {"gpt-oss", "logits of a gpt-oss checkpoint for given tokens (single device, TP or EP mesh)",
     &gpt_oss_main}};

}  // namespace run_gpt_oss
}  // namespace meshtest::tools
