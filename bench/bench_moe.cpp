// meshtest-bench moe: the MoE pieces against baselines measured in the same run —
// (a) grouped_gemm against one dense Eigen GEMM of the same total size (uniform, Zipf and
// all-to-one routing); (b) the expert-parallel dispatch + combine on the EP axis: rows, bytes
// and messages per device against the minimum and against an all_gather-everything exchange,
// and their time; (c) the EP MLP block against the all_gather-everything block and the TP MLP
// block on the same mesh. Defaults: gpt-oss-20b's MLP widths, T = 1024 tokens (moe_tables.cpp
// measures and prints; docs/moe.md explains the columns).
#include <fmt/format.h>
#include <mpi.h>
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <charconv>
#include <chrono>
#include <iostream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bench/moe_tables.hpp"
#include "dist/ccl/malloc_tuning.hpp"
#include "dist/mesh/environment.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/core/file.hpp"
#include "tools/mesh_arg.hpp"
#include "tools/mpi_subcommand.hpp"
#include "tools/subcommand.hpp"

namespace meshtest::tools {
namespace bench_moe {

namespace po = boost::program_options;
using bench::MoeBenchOptions;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  for (std::size_t end = s.find(sep); end != std::string::npos; end = s.find(sep, pos)) {
    out.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  out.push_back(s.substr(pos));
  return out;
}

/// "2048x2880x2880x32,512x1024x1024x8" -> the sizes; each field a positive integer.
std::vector<bench::GemmSize> parse_gemms(const std::string& s) {
  std::vector<bench::GemmSize> out;
  for (const std::string& item : split(s, ',')) {
    const std::vector<std::string> f = split(item, 'x');
    std::array<std::int64_t, 4> v{};
    bool ok = f.size() == 4;
    for (std::size_t i = 0; ok && i < 4; ++i) {
      const auto [p, ec] = std::from_chars(f[i].data(), f[i].data() + f[i].size(), v[i]);
      ok = ec == std::errc{} && p == f[i].data() + f[i].size() && v[i] >= 1;
    }
    MESHTEST_CHECK(ok,
                   "--gemm: '{}' is not ROWSxINxOUTxEXPERTS with positive integers (e.g. "
                   "2048x2880x2880x32)",
                   item);
    out.push_back({.rows = v[0], .in = v[1], .out = v[2], .experts = v[3]});
  }
  return out;
}

/// Parses and checks the options (every rank alike, before any communication); false after
/// --help (printed by rank 0).
bool parse(int argc, char** argv, const dist::Environment& env, MoeBenchOptions& o,
           std::string& json_path) {
  po::options_description opts(
      "meshtest-bench moe: (a) grouped GEMM GFLOP/s against one dense Eigen GEMM of the same "
      "total size, for uniform, Zipf and all-to-one routing (rank 0 alone); (b) the "
      "expert-parallel dispatch + combine on the EP axis: bytes, messages and time per device "
      "against the minimum bytes and an all_gather-everything exchange; (c) the EP MLP block "
      "against the all_gather-everything and TP MLP blocks on the same mesh. f32, random "
      "weights; the defaults are gpt-oss-20b's MLP (hidden 2880, intermediate 2880, 32 experts "
      "top-4) with T = 1024 tokens. --device cuda: table (a) on rank 0's GPU (bf16 by default) "
      "against one dense cuBLASLt GEMM, at the 20b expert GEMMs of 2048 tokens top-4; (b) and "
      "(c) on GPU ranks for a prefill of 2048 tokens and a decode batch of 64: the EP exchange "
      "against NCCL's own all_to_all of the same rows, the EP block against the TP block and "
      "its compute against its grouped GEMMs.\n"
      "Run as: ./launch/meshtest bench moe -np 8 [options]\n"
      "Options");
  auto add = opts.add_options();
  add("help,h", "print this help");
  add("mesh", po::value<std::string>(),
      "mesh RxC (or N for 1 x N), R*C = mpirun -np. Default: np x 1 (EP over every device)");
  add("ep-axis", po::value(&o.ep_axis)->default_value(0),
      "mesh axis of the experts (0 or 1); "
      "their units are split over the other axis (TP)");
  add("hidden", po::value(&o.hidden)->default_value(o.hidden), "hidden size");
  add("intermediate", po::value(&o.intermediate)->default_value(o.intermediate),
      "expert FFN width I");
  add("experts", po::value(&o.experts)->default_value(o.experts), "experts E");
  add("k", po::value(&o.k)->default_value(o.k), "experts per token (1 .. E)");
  add("tokens", po::value(&o.tokens)->default_value(o.tokens),
      "tokens T of the whole EP group (split over the EP axis; --device cuda: default 2048)");
  add("gemm", po::value<std::string>()->default_value("2048x2880x2880x32,512x1024x1024x8"),
      "table (a): comma list of ROWSxINxOUTxEXPERTS (--device cuda: default "
      "8192x2880x5760x32,8192x2880x2880x32, mlp1 and mlp2 of 2048 tokens top-4)");
  add("device", po::value(&o.device)->default_value("cpu"),
      "cpu, or cuda: table (a) on rank 0's GPU, (b) and (c) on GPU ranks, one GPU per rank (a "
      "build with the GPU side)");
  add("decode", po::value(&o.decode)->default_value(o.decode),
      "--device cuda: the decode batch of tables (b) and (c), beside the prefill of --tokens");
  add("dtype", po::value<std::string>(), "--device cuda: bf16 (default) or f32");
  add("parts", po::value<std::string>()->default_value("gemm,exchange,block"),
      "tables to print: gemm (a), exchange (b), block (c)");
  add("iters", po::value(&o.iters)->default_value(o.iters), "measured calls per figure");
  add("warmup", po::value(&o.warmup)->default_value(o.warmup), "warm-up calls per figure");
  add("seed", po::value(&o.seed)->default_value(o.seed), "seed of the weights and tokens");
  add("json", po::value(&json_path), "also write the tables as JSON to FILE");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, opts), vm);
  if (vm.count("help") != 0) {
    if (env.rank() == 0) std::cout << opts << "\n";
    return false;
  }
  po::notify(vm);
  o.mesh = vm.count("mesh") != 0 ? parse_mesh_arg(vm["mesh"].as<std::string>())
                                 : std::array<int, 2>{env.size(), 1};
  MESHTEST_CHECK(o.mesh[0] * o.mesh[1] == env.size(),
                 "--mesh {}x{} has {} devices but mpirun started {} ranks", o.mesh[0], o.mesh[1],
                 o.mesh[0] * o.mesh[1], env.size());
  MESHTEST_CHECK(o.ep_axis == 0 || o.ep_axis == 1, "--ep-axis: {} is not a mesh axis (0 or 1)",
                 o.ep_axis);
  MESHTEST_CHECK(o.hidden >= 1 && o.intermediate >= 1 && o.experts >= 1 && o.tokens >= 1,
                 "--hidden, --intermediate, --experts and --tokens must be >= 1; got {}, {}, {}, "
                 "{}",
                 o.hidden, o.intermediate, o.experts, o.tokens);
  MESHTEST_CHECK(o.k >= 1 && o.k <= o.experts, "--k: {} is outside 1 .. {} (--experts)", o.k,
                 o.experts);
  const int tp = o.mesh[static_cast<std::size_t>(1 - o.ep_axis)];
  MESHTEST_CHECK(o.intermediate % tp == 0,
                 "--intermediate {} is not a multiple of the TP size {} (mesh axis {})",
                 o.intermediate, tp, 1 - o.ep_axis);
  MESHTEST_CHECK(o.iters >= 1 && o.warmup >= 0,
                 "--iters must be >= 1 and --warmup >= 0; got {}, {}", o.iters, o.warmup);
  MESHTEST_CHECK(o.device == "cpu" || o.device == "cuda", "--device: '{}' is not cpu or cuda",
                 o.device);
  const bool cuda = o.device == "cuda";
  MESHTEST_CHECK(!cuda || MESHTEST_BENCH_CUDA,
                 "--device cuda: this meshtest-bench was built without the GPU side (configure "
                 "with -DMESHTEST_CUDA=ON; docs/gpu.md)");
  o.dtype = vm.count("dtype") != 0 ? vm["dtype"].as<std::string>() : (cuda ? "bf16" : "f32");
  MESHTEST_CHECK(cuda ? (o.dtype == "bf16" || o.dtype == "f32") : o.dtype == "f32",
                 "--dtype: '{}' is not {}", o.dtype,
                 cuda ? "bf16 or f32" : "f32 (the CPU tables are f32; bf16 with --device cuda)");
  o.gemms = parse_gemms(cuda && vm["gemm"].defaulted() ? "8192x2880x5760x32,8192x2880x2880x32"
                                                       : vm["gemm"].as<std::string>());
  for (const std::string& part : split(vm["parts"].as<std::string>(), ',')) {
    MESHTEST_CHECK(part == "gemm" || part == "exchange" || part == "block",
                   "--parts: unknown part '{}' (expected gemm, exchange, block)", part);
    o.parts.insert(part);
  }
  if (cuda && vm["tokens"].defaulted()) o.tokens = 2048;  // gpt-oss-20b's prefill of the issue
  MESHTEST_CHECK(o.decode >= 1, "--decode must be >= 1; got {}", o.decode);
  if (!json_path.empty()) check_outputs_writable({json_path}, env.rank());
  return true;
}

/// MPI_Barrier without spinning: MPI_Ibarrier tested every millisecond, so that ranks waiting
/// for rank 0's single-process table leave the cores to it. Collective over comm.
void idle_barrier(MPI_Comm comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  MESHTEST_MPI(MPI_Ibarrier(comm, &request));
  for (int done = 0;;) {
    MESHTEST_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done != 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int run(int argc, char** argv, const dist::Environment& env, MpiRunState& state) {
  MoeBenchOptions o;
  std::string json_path;
  if (!parse(argc, argv, env, o, json_path)) return 0;
  state.communicating = true;  // every rank parsed the same options above
  const dist::MeshDevice mesh(std::vector<int>{o.mesh[0], o.mesh[1]});
  const bool root = mesh.device_id() == 0;
  nlohmann::json doc = bench::moe_header(mesh, o);
  bench::Verdicts verdicts;
  if (o.parts.count("gemm") != 0) {
    if (root) {
#if MESHTEST_BENCH_CUDA
      doc["gemm"] =
          o.device == "cuda" ? bench::gemm_table_cuda(o, verdicts) : bench::gemm_table(o, verdicts);
#else
      doc["gemm"] = bench::gemm_table(o, verdicts);
#endif
    }
    idle_barrier(mesh.comm());  // the other ranks wait for rank 0's table, leaving it the cores
  }
  if (o.parts.count("exchange") != 0 || o.parts.count("block") != 0) {
#if MESHTEST_BENCH_CUDA
    if (o.device == "cuda") {
      if (!bench::ep_tables_cuda(mesh, o, doc, verdicts)) return 2;  // no GPU ranks: said why
    } else {
      bench::ep_tables(mesh, o, doc, verdicts);
    }
#else
    bench::ep_tables(mesh, o, doc, verdicts);
#endif
  }
  if (root) {
    fmt::print("\ntargets:\n");
    for (const std::string& v : verdicts.lines) fmt::print("  {}\n", v);
    doc["targets"] = verdicts.lines;
    doc["checks_failed"] = verdicts.failed;
    if (!json_path.empty()) {
      const std::string text = doc.dump(2) + "\n";
      const std::span<const std::byte> part(reinterpret_cast<const std::byte*>(text.data()),
                                            text.size());
      write_file_atomic(json_path, std::span(&part, 1));
      fmt::print("wrote {}\n", json_path);
    }
  }
  int failed = verdicts.failed;
  MESHTEST_MPI(MPI_Bcast(&failed, 1, MPI_INT, 0, mesh.comm()));
  return failed == 0 ? 0 : 1;
}

int bench_moe_main(int argc, char** argv) {
  // Freed large buffers stay in the heap (see the header), so no op or CCL pays page faults on
  // fresh memory at every call: the schemes are compared in their steady state.
  dist::tune_malloc_for_collectives();
  return mpi_subcommand("meshtest-bench moe", argc, argv, run);
}

const RegisterSubcommand reg{
    {"moe", "grouped GEMM vs dense, EP dispatch/combine vs minimum and all_gather, EP vs TP block",
     &bench_moe_main}};

}  // namespace bench_moe
}  // namespace meshtest::tools
