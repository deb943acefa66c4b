// meshtest-report: compare, check shapes of, summarize and plot ops_perf reports; hold a
// measurements.json against its perf expectation.
#include <fmt/format.h>
#include <boost/program_options.hpp>

#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "src/core/error.hpp"
#include "src/core/file.hpp"
#include "src/perf/compare.hpp"
#include "src/perf/flight.hpp"
#include "src/perf/measurements.hpp"
#include "src/perf/ops_csv.hpp"
#include "src/perf/perf_check.hpp"
#include "src/perf/plot.hpp"
#include "src/perf/report.hpp"

namespace meshtest::perf {
namespace {

namespace po = boost::program_options;

constexpr int kOk = 0, kMismatch = 1, kBadInput = 2;

/// A subcommand's parsed options; `help` set when --help was given (the text is printed).
struct Parsed {
  po::variables_map vm;
  bool help = false;
};

/// Parses argv for a subcommand with positional `names` (all required) and extra `opts`.
Parsed parse(const std::string& cmd, const std::string& usage, std::vector<std::string> argv,
             const std::vector<std::string>& names, po::options_description opts) {
  opts.add_options()("help,h", "print this help");
  po::options_description all;
  all.add(opts);
  po::positional_options_description pos;
  for (const std::string& n : names) {
    all.add_options()(n.c_str(), po::value<std::string>(), "");
    pos.add(n.c_str(), 1);
  }
  Parsed p;
  po::store(po::command_line_parser(argv).options(all).positional(pos).run(), p.vm);
  if (p.vm.count("help")) {
    std::cout << "usage: meshtest-report " << cmd << " " << usage << "\n" << opts;
    p.help = true;
    return p;
  }
  po::notify(p.vm);
  for (const std::string& n : names) {
    MESHTEST_CHECK(p.vm.count(n), "{}: missing argument {} (usage: meshtest-report {} {})", cmd, n,
                   cmd, usage);
  }
  return p;
}

int print_result(const CompareResult& r) {
  for (const std::string& p : r.problems) fmt::print("  {}\n", p);
  fmt::print("{}\n", r.summary);
  return r.ok ? kOk : kMismatch;
}

po::options_description iteration_options(bool two) {
  po::options_description o("options");
  if (two) {
    o.add_options()("unit-iterations", po::value<int>()->default_value(0),
                    "iterations in the first report's measured region (0: one per start/stop "
                    "signpost pair)");
    o.add_options()("module-iterations", po::value<int>()->default_value(0),
                    "iterations in the second report's measured region (0: per signpost pair)");
  } else {
    o.add_options()("iterations", po::value<int>()->default_value(0),
                    "iterations in the measured region (0: one per start/stop signpost pair)");
  }
  return o;
}

CompareOptions compare_options(const po::variables_map& vm) {
  return {.unit_iterations = vm["unit-iterations"].as<int>(),
          .module_iterations = vm["module-iterations"].as<int>()};
}

/// compare and shapes: two reports in, a CompareResult out.
int cmd_two_reports(const std::vector<std::string>& args, const std::string& cmd,
                    const std::string& usage,
                    CompareResult (*check)(const OpsReport&, const OpsReport&,
                                           const CompareOptions&)) {
  const Parsed p = parse(cmd, usage, args, {"first", "second"}, iteration_options(true));
  if (p.help) return kOk;
  const OpsReport first = read_ops_csv(p.vm["first"].as<std::string>());
  const OpsReport second = read_ops_csv(p.vm["second"].as<std::string>());
  return print_result(check(first, second, compare_options(p.vm)));
}

int cmd_compare(const std::vector<std::string>& args) {
  return cmd_two_reports(args, "compare", "UNIT.csv MODULE.csv", compare_configs);
}

int cmd_shapes(const std::vector<std::string>& args) {
  return cmd_two_reports(args, "shapes", "SINGLE.csv MULTI.csv", compare_shapes);
}

Aggregate aggregate_file(const po::variables_map& vm, const std::string& key) {
  return aggregate(read_ops_csv(vm[key].as<std::string>()).records,
                   {.iterations = vm["iterations"].as<int>()});
}

int cmd_summary(const std::vector<std::string>& args) {
  const Parsed p = parse("summary", "REPORT.csv", args, {"csv"}, iteration_options(false));
  if (p.help) return kOk;
  const Aggregate a = aggregate_file(p.vm, "csv");
  fmt::print("{}: {} devices, {} measured iterations, {} ops per iteration\n",
             p.vm["csv"].as<std::string>(), a.devices, a.iterations, a.ops.size());
  fmt::print("{}", summary_table(a));
  fmt::print("total_kernel_duration_us = {:.3f}\ntotal_op_to_op_latency_us = {:.3f}\n",
             a.total_kernel_duration_us, a.total_op_to_op_latency_us);
  return kOk;
}

int cmd_plot_ops(const std::vector<std::string>& args) {
  po::options_description o = iteration_options(false);
  o.add_options()("title", po::value<std::string>()->default_value("per-op duration"),
                  "plot title");
  const Parsed p = parse("plot-ops", "REPORT.csv OUT.png", args, {"csv", "png"}, o);
  if (p.help) return kOk;
  require_gnuplot();
  plot_op_durations(aggregate_file(p.vm, "csv"), p.vm["png"].as<std::string>(),
                    p.vm["title"].as<std::string>());
  fmt::print("wrote {}\n", p.vm["png"].as<std::string>());
  return kOk;
}

int cmd_plot_ccl(const std::vector<std::string>& args) {
  po::options_description o("options");
  o.add_options()("title", po::value<std::string>()->default_value("CCL bus bandwidth"),
                  "plot title");
  const Parsed p = parse("plot-ccl", "BENCH.json OUT.png", args, {"json", "png"}, o);
  if (p.help) return kOk;
  require_gnuplot();
  const std::string path = p.vm["json"].as<std::string>();
  plot_ccl_busbw(parse_ccl_bench_json(read_text_file(path), path), p.vm["png"].as<std::string>(),
                 p.vm["title"].as<std::string>());
  fmt::print("wrote {}\n", p.vm["png"].as<std::string>());
  return kOk;
}

int cmd_flight(const std::vector<std::string>& args) {
  po::options_description o("options");
  o.add_options()("ranks", po::value<int>()->default_value(0),
                  "ranks in the job (0: as the dumps say); ranks without a dump are named");
  const Parsed p = parse("flight", "DIR", args, {"dir"}, o);
  if (p.help) return kOk;
  const int ranks = p.vm["ranks"].as<int>();
  MESHTEST_CHECK(ranks >= 0, "flight: --ranks must be >= 0, got {}", ranks);
  fmt::print("{}", flight_summary(read_flight_dir(p.vm["dir"].as<std::string>()), ranks));
  return kOk;
}

int cmd_check_perf(const std::vector<std::string>& args) {
  po::options_description o("options");
  o.add_options()("margin", po::value<double>(),
                  "relative slack: a row regresses when measured > expected x (1 + margin) "
                  "(default: the expectation's \"margin\", else 0.1)")(
      "min-us", po::value<double>()->default_value(0.0),
      "and when measured - expected > this many microseconds (timer noise of tiny ops)")(
      "update",
      "write MEASURED as the new expectation into EXPECTED (with --margin, if given, as its "
      "margin) instead of checking");
  const Parsed p =
      parse("check-perf", "EXPECTED.json MEASURED.json", args, {"expected", "measured"}, o);
  if (p.help) return kOk;
  const std::string expected_path = p.vm["expected"].as<std::string>();
  const std::string measured_path = p.vm["measured"].as<std::string>();
  const std::string measured_text = read_text_file(measured_path);
  const PerfFigures measured = parse_perf_figures(measured_text, measured_path);
  if (p.vm.count("update")) {
    const std::optional<double> margin =
        p.vm.count("margin") ? std::optional(p.vm["margin"].as<double>()) : std::nullopt;
    write_text_atomic(expected_path,
                      expectation_json(measured_text, margin, "check-perf --margin"));
    fmt::print("wrote {} ({} ops, total kernel {:.3f} us) from {}\n", expected_path,
               measured.ops.size(), measured.total_kernel_duration_us, measured_path);
    return kOk;
  }
  const PerfFigures expected = parse_perf_figures(read_text_file(expected_path), expected_path);
  PerfCheckOptions opt{.margin = expected.margin.value_or(0.1),
                       .min_us = p.vm["min-us"].as<double>()};
  if (p.vm.count("margin")) opt.margin = p.vm["margin"].as<double>();
  const PerfCheck c = check_perf(expected, measured, opt);
  fmt::print("check-perf {} against {}\n{}", measured_path, expected_path, c.table(opt));
  return c.regressed ? kMismatch : kOk;
}

struct Command {
  std::function<int(const std::vector<std::string>&)> run;
  const char* summary;
};

const std::map<std::string, Command>& commands() {
  static const std::map<std::string, Command> c = {
      {"compare",
       {cmd_compare,
        "UNIT.csv MODULE.csv: find the unit test's op sequence as a unique contiguous run of "
        "the module's ops and compare attributes and every INPUT_/OUTPUT_ field"}},
      {"shapes",
       {cmd_shapes,
        "SINGLE.csv MULTI.csv: the single-device run's shapes equal device 0's, op by op"}},
      {"summary", {cmd_summary, "REPORT.csv: the aggregated per-op table and totals"}},
      {"check-perf",
       {cmd_check_perf,
        "EXPECTED.json MEASURED.json: a measurements.json against expected per-op device times "
        "and totals (an earlier run's measurements.json, or one --update wrote), with a "
        "margin; exit 1 on a regression"}},
      {"flight",
       {cmd_flight,
        "DIR: the flight recorder's dumps (reports/flight/rank<r>.json): the first collective "
        "where the ranks differ or stopped, and each rank's last one"}},
      {"plot-ops", {cmd_plot_ops, "REPORT.csv OUT.png: per-op duration bars (gnuplot)"}},
      {"plot-ccl",
       {cmd_plot_ccl,
        "BENCH.json OUT.png: busbw vs message size, meshtest and MPI, from "
        "`meshtest-bench ccl --json` (gnuplot)"}},
  };
  return c;
}

void usage() {
  fmt::print(
      "meshtest-report: compare, summarize and plot ops_perf reports; read flight recorder "
      "dumps\n\n"
      "usage: meshtest-report <command> [options] ARGS   (meshtest-report <command> --help)\n\n"
      "commands:\n");
  for (const auto& [name, c] : commands()) fmt::print("  {:<10} {}\n", name, c.summary);
  fmt::print(
      "\nexit status: 0 ok, 1 mismatch (compare, shapes) or regression (check-perf), 2 bad input "
      "(unreadable or invalid report, bad options, gnuplot missing)\n");
}

int main_impl(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    usage();
    return args.empty() ? kBadInput : kOk;
  }
  const auto it = commands().find(args[0]);
  MESHTEST_CHECK(
      it != commands().end(),
      "unknown command '{}' (expected compare, shapes, summary, check-perf, flight, plot-ops or "
      "plot-ccl; "
      "see meshtest-report --help)",
      args[0]);
  args.erase(args.begin());
  return it->second.run(args);
}

}  // namespace
}  // namespace meshtest::perf

int main(int argc, char** argv) {
  try {
    return meshtest::perf::main_impl(argc, argv);
  } catch (const std::exception& e) {
    // meshtest::Error (bad report, missing gnuplot) and Boost.Program_options errors alike.
    fmt::print(stderr, "meshtest-report: error: {}\n", e.what());
    return meshtest::perf::kBadInput;
  }
}
