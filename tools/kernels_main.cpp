// meshtest-kernels: the kernel-version harness (src/kernels, docs/kernel-versions.md).
//   meshtest-kernels test [FAMILY] [--quick]
//   meshtest-kernels bench [FAMILY] [--quick] [--iterations N] [--warmup N] [--json F]
// test runs every version against the reference on every configuration (exit 1 if one
// fails); bench runs the same correctness suite first and refuses to time a family that fails.
#include <fmt/format.h>

#include <boost/program_options.hpp>
#include <iostream>
#include <string>
#include <vector>

#include "src/core/error.hpp"
#include "src/kernels/bench.hpp"
#include "src/kernels/family.hpp"
#include "src/perf/report.hpp"
#include "tools/subcommand.hpp"

namespace meshtest::tools {
namespace {

namespace po = boost::program_options;
using kernels::Family;

struct Common {
  std::vector<const Family*> families;
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
    std::cout << "\n";
    return std::nullopt;
  }
  po::notify(vm);
  Common c;
  c.quick = vm.count("quick") > 0;
  if (vm.count("family")) {
    c.families.push_back(&kernels::family(vm["family"].as<std::string>()));
  } else {
    for (const Family& f : kernels::families()) c.families.push_back(&f);
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
    fmt::print("correctness: all {} checks passed; timing ({} warm-up, {} timed runs each)\n",
               checks.size(), bo.warmup, bo.iterations);
    const auto results = kernels::bench_family(*f, configs, bo);
    fmt::print("{}\n", kernels::bench_report(*f, results));
    json += kernels::bench_json(*f, results);
  }
  if (vm.count("json")) perf::write_text_atomic(vm["json"].as<std::string>(), json);
  return 0;
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
