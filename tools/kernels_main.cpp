// meshtest-kernels: the kernel-version harness (src/kernels, docs/kernel-versions.md).
//   meshtest-kernels test [FAMILY] [--quick]
//   meshtest-kernels bench [FAMILY] [--quick] [--iterations N] [--warmup N] [--json F]
// test runs every version against the reference on every configuration (exit 1 if one
// fails); bench runs the same correctness suite first and refuses to time a family that fails.
// The GPU families (fp8_matmul_gpu: src/gpu/kernels, docs/gpu-kernels.md) are built with the GPU
// side; without a GPU they are skipped with the reason (an error when named), and their bench
// times each version on the configurations it passed.
#include <fmt/format.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <iostream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/error.hpp"
#include "src/kernels/bench.hpp"
#include "src/kernels/family.hpp"
#include "src/perf/report.hpp"
#include "tools/subcommand.hpp"

#if MESHTEST_KERNELS_GPU
#include "src/gpu/kernels/family.hpp"
#include "src/gpu/kernels/fp8_matmul.hpp"
#endif

namespace meshtest::tools {
namespace {

namespace po = boost::program_options;
using kernels::Family;

/// The families that run on a GPU, built or not (so that naming one in a CPU build says why).
constexpr std::string_view kGpuFamilies[] = {"fp8_matmul_gpu"};

#if MESHTEST_KERNELS_GPU
const std::vector<gpu::GpuFamily>& gpu_families() {
  static const std::vector<gpu::GpuFamily> all = {gpu::fp8_matmul_gpu_family()};
  return all;
}
#endif

struct Common {
  std::vector<const Family*> families;
#if MESHTEST_KERNELS_GPU
  std::vector<const gpu::GpuFamily*> gpu_families;
#endif
  bool named = false;  ///< one family named on the command line
  bool quick = false;
};

/// Parses [FAMILY] --quick and the extra options; nullopt after --help.
std::optional<Common> parse(int argc, char** argv, po::options_description& opts,
                            po::variables_map& vm) {
  auto add = opts.add_options();
  add("help,h", "print this help");
  add("family", po::value<std::string>(), "one family (default: all)");
  add("quick", "the small configurations only");
  po::positional_options_description pos;
  pos.add("family", 1);
  po::store(po::command_line_parser(argc, argv).options(opts).positional(pos).run(), vm);
  if (vm.count("help")) {
    std::cout << opts << "\nfamilies:";
    for (const Family& f : kernels::families()) std::cout << " " << f.name;
    for (std::string_view name : kGpuFamilies) std::cout << " " << name << " (GPU)";
    std::cout << "\n";
    return std::nullopt;
  }
  po::notify(vm);
  Common c;
  c.quick = vm.count("quick") > 0;
  if (vm.count("family")) {
    c.named = true;
    const std::string name = vm["family"].as<std::string>();
    if (std::ranges::find(kGpuFamilies, name) != std::end(kGpuFamilies)) {
#if MESHTEST_KERNELS_GPU
      for (const gpu::GpuFamily& f : gpu_families()) {
        if (f.name == name) c.gpu_families.push_back(&f);
      }
#else
      fail(
          "kernel family {} runs on a GPU, and this meshtest-kernels was built without the GPU "
          "side (MESHTEST_CUDA=OFF, or the CUDA toolkit or NCCL not found at configure: "
          "docs/gpu.md)",
          name);
#endif
    } else {
      c.families.push_back(&kernels::family(name));
    }
  } else {
    for (const Family& f : kernels::families()) c.families.push_back(&f);
#if MESHTEST_KERNELS_GPU
    for (const gpu::GpuFamily& f : gpu_families()) c.gpu_families.push_back(&f);
#endif
  }
  return c;
}

const std::vector<kernels::Config>& configs_of(const Family& f, bool quick) {
  return quick ? f.quick_configs : f.configs;
}

void describe(const Family& f) {
  fmt::print("{}: {}\n", f.name, f.description);
  for (const kernels::Version& v : f.versions) fmt::print("  {}: {}\n", v.name, v.description);
}

#if MESHTEST_KERNELS_GPU
/// Prints the family and returns true when it can run here; otherwise a skip line naming why
/// (false), or, when the family was named on the command line, an Error.
bool describe_gpu(const gpu::GpuFamily& f, bool named) {
  const std::string why = gpu::gpu_unavailable_reason();
  if (!why.empty()) {
    MESHTEST_CHECK(!named, "kernel family {} runs on a GPU: {}", f.name, why);
    fmt::print("{}: skipped: {}\n\n", f.name, why);
    return false;
  }
  fmt::print("{}: {} (on the GPU, cuda:0)\n", f.name, f.cpu->description);
  for (const gpu::GpuVersion& v : f.versions) fmt::print("  {}: {}\n", v.name, v.description);
  return true;
}

std::vector<kernels::Config> gpu_configs(const gpu::GpuFamily& f, bool quick) {
  return quick ? f.quick_configs() : f.configs();
}
#endif

int test_main(int argc, char** argv) {
  po::options_description opts(
      "meshtest-kernels test [FAMILY] [--quick]: every version of each family against its\n"
      "reference on every configuration; exit 1 if one fails");
  po::variables_map vm;
  const auto c = parse(argc, argv, opts, vm);
  if (!c) return 0;
  bool ok = true;
  for (const Family* f : c->families) {
    describe(*f);
    const auto checks = kernels::check_family(*f, configs_of(*f, c->quick));
    fmt::print("{}\n", kernels::correctness_report(checks));
    ok = ok && kernels::all_pass(checks);
  }
#if MESHTEST_KERNELS_GPU
  for (const gpu::GpuFamily* f : c->gpu_families) {
    if (!describe_gpu(*f, c->named)) continue;
    const auto checks = gpu::check_gpu_family(*f, gpu_configs(*f, c->quick));
    fmt::print("{}\n", gpu::gpu_correctness_report(checks));
    ok = ok && gpu::all_pass(checks);
  }
#endif
  return ok ? 0 : 1;
}

int bench_main(int argc, char** argv) {
  po::options_description opts(
      "meshtest-kernels bench [FAMILY] [--quick] [--iterations N] [--warmup N] [--json F]:\n"
      "times every version beside Eigen's f32 GEMM of the same shape, after the correctness\n"
      "suite passes (a family that fails it is not timed: exit 1)");
  opts.add_options()("iterations", po::value<int>()->default_value(10), "timed runs")(
      "warmup", po::value<int>()->default_value(2), "untimed runs first")(
      "json", po::value<std::string>(), "also write the timings as JSON lines to this file");
  po::variables_map vm;
  const auto c = parse(argc, argv, opts, vm);
  if (!c) return 0;
  const kernels::BenchOptions bo{.warmup = vm["warmup"].as<int>(),
                                 .iterations = vm["iterations"].as<int>()};
  MESHTEST_CHECK(bo.iterations >= 1, "--iterations {} must be >= 1", bo.iterations);
  MESHTEST_CHECK(bo.warmup >= 0, "--warmup {} must be >= 0", bo.warmup);
  std::string json;
  for (const Family* f : c->families) {
    describe(*f);
    const auto& configs = configs_of(*f, c->quick);
    const auto checks = kernels::check_family(*f, configs);
    if (!kernels::all_pass(checks)) {
      fmt::print("{}\n{}: the correctness suite fails; not benchmarking it\n",
                 kernels::correctness_report(checks), f->name);
      return 1;
    }
    fmt::print("correctness: all {} checks passed; timing ({} warm-up, {} timed runs each)\n{}\n",
               checks.size(), bo.warmup, bo.iterations, kernels::cpu_device_line());
    const auto results = kernels::bench_family(*f, configs, bo);
    fmt::print("{}\n", kernels::bench_report(*f, results));
    json += kernels::bench_json(*f, results);
  }
  bool ok = true;
#if MESHTEST_KERNELS_GPU
  for (const gpu::GpuFamily* f : c->gpu_families) {
    if (!describe_gpu(*f, c->named)) continue;
    const auto configs = gpu_configs(*f, c->quick);
    const auto checks = gpu::check_gpu_family(*f, configs);
    if (!gpu::all_pass(checks)) {
      // A version that fails a configuration is not timed there; the others are.
      fmt::print(
          "{}\n{}: the correctness suite fails; timing only the versions that passed, on "
          "the configurations they passed\n",
          gpu::gpu_correctness_report(checks), f->name);
      ok = false;
    } else {
      fmt::print("{}", gpu::gpu_correctness_report(checks));
    }
    fmt::print(
        "timing on the GPU with CUDA events ({} warm-up, {} timed runs each; operands "
        "uploaded before)\n{}\n",
        bo.warmup, bo.iterations, gpu::gpu_device_line());
    const auto results = gpu::bench_gpu_family(*f, configs, checks, bo);
    fmt::print("{}\n", kernels::bench_report(f->name, gpu::version_names(*f), results));
    json += kernels::bench_json(f->name, results);
  }
#endif
  if (vm.count("json")) perf::write_text_atomic(vm["json"].as<std::string>(), json);
  return ok ? 0 : 1;
}

const RegisterSubcommand test_reg{
    {"test", "every version against the reference on every configuration", &test_main}};
const RegisterSubcommand bench_reg{
    {"bench", "time every version beside Eigen's f32 GEMM, after the correctness suite",
     &bench_main}};

}  // namespace
}  // namespace meshtest::tools

int main(int argc, char** argv) {
  try {
    return meshtest::tools::dispatch(
        "meshtest-kernels",
        "meshtest-kernels: several versions of a kernel, checked against a reference before "
        "they are timed",
        argc, argv);
  } catch (const std::exception& e) {
    // meshtest::Error (an unknown family, a bad option value) and Program_options errors.
    fmt::print(stderr, "meshtest-kernels: error: {}\n", e.what());
    return 2;
  }
}
