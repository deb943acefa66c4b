// Timing and the benchmark report of a kernel family.
#include "src/kernels/bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>

#include "src/core/error.hpp"
#include "src/core/random.hpp"
#include "src/perf/machine.hpp"

namespace meshtest::kernels {

namespace {

Timing time_runs(const std::string& name, double flops, const BenchOptions& opt,
                 const std::function<void()>& run) {
  for (int i = 0; i < opt.warmup; ++i) run();
  std::vector<double> ms;
  for (int i = 0; i < opt.iterations; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return summarize_runs(name, ms, flops);
}

const Timing& fastest(const ConfigBench& c) {
  return *std::ranges::min_element(c.versions, {}, &Timing::mean_ms);
}

/// "eigen" for "eigen f32": the baseline's column label.
std::string baseline_label(const ConfigBench& c) {
  return c.baseline.version.substr(0, c.baseline.version.find(' '));
}

/// The mean time of `version` on c, or nullptr when it was not timed there.
const Timing* timing_of(const ConfigBench& c, const std::string& version) {
  const auto it = std::ranges::find(c.versions, version, &Timing::version);
  return it == c.versions.end() ? nullptr : &*it;
}

}  // namespace

std::vector<ConfigBench> bench_family(const Family& f, std::span<const Config> configs,
                                      const BenchOptions& opt) {
  std::vector<ConfigBench> out;
  for (const Config& c : configs) {
    const Inputs in = f.make_inputs(c);
    const double flops = f.flops(c);
    ConfigBench r{.config = c, .versions = {}, .baseline = {}};
    for (const Version& v : f.versions) {
      r.versions.push_back(time_runs(v.name, flops, opt, [&] { (void)v.run(in); }));
    }
    // The same product in f32 with the weight in the same [n, k] layout: y = a · bᵀ.
    const Tensor a = random_normal(Shape({c.m, c.k}), DType::f32, {.seed = 5, .stream = 1});
    const Tensor b = random_normal(Shape({c.n, c.k}), DType::f32, {.seed = 5, .stream = 2});
    Tensor y(Shape({c.m, c.n}), DType::f32);
    r.baseline = time_runs("eigen f32", flops, opt, [&] {
      y.matrix<float>().noalias() = a.matrix<float>() * b.matrix<float>().transpose();
    });
    out.push_back(std::move(r));
  }
  return out;
}

std::string recommendation(const std::string& simplest, const std::string& winner, double speedup) {
  if (winner == simplest) return fmt::format("take {}: the simplest version wins", winner);
  const double gain = speedup - 1;
  if (gain < 0) {
    return fmt::format("prefer {}: {} wins the most configurations but is {:.1f} % slower",
                       simplest, winner, -100 * gain);
  }
  if (gain < 0.05) {
    return fmt::format("prefer {}: {} is only {:.1f} % faster, not worth its complexity", simplest,
                       winner, 100 * gain);
  }
  if (gain <= 0.10) {
    return fmt::format("weigh it: {} is {:.1f} % faster than the simpler {}", winner, 100 * gain,
                       simplest);
  }
  return fmt::format("take {}: {:.1f} % faster than the simpler {}", winner, 100 * gain, simplest);
}

Timing summarize_runs(std::string name, std::span<const double> ms, double flops) {
  MESHTEST_CHECK(!ms.empty(), "kernel bench: no timed run of {}", name);
  Timing t{.version = std::move(name)};
  double sum = 0, sq = 0;
  for (double v : ms) sum += v;
  t.mean_ms = sum / static_cast<double>(ms.size());
  for (double v : ms) sq += (v - t.mean_ms) * (v - t.mean_ms);
  t.std_ms = std::sqrt(sq / static_cast<double>(ms.size()));
  t.best_ms = *std::ranges::min_element(ms);
  t.max_ms = *std::ranges::max_element(ms);
  t.tflops = flops / (t.mean_ms * 1e-3) / 1e12;
  t.best_tflops = flops / (t.best_ms * 1e-3) / 1e12;
  return t;
}

std::string cpu_device_line() {
  return fmt::format("device: {}, {} hardware threads", perf::cpu_model_name(),
                     std::thread::hardware_concurrency());
}

std::vector<std::string> version_names(const Family& f) {
  std::vector<std::string> names;
  for (const Version& v : f.versions) names.push_back(v.name);
  return names;
}

std::string bench_report(const Family& f, std::span<const ConfigBench> results) {
  const std::vector<std::string> names = version_names(f);
  return bench_report(f.name, names, results);
}

std::string bench_report(std::string_view family, std::span<const std::string> versions,
                         std::span<const ConfigBench> results) {
  std::string out;
  std::map<std::string, int> wins;
  std::map<std::string, double> total_ms;
  for (const ConfigBench& r : results) {
    out += fmt::format("\n{} {}: m {} n {} k {} block {}\n", family, r.config.name, r.config.m,
                       r.config.n, r.config.k, r.config.block);
    if (r.versions.empty()) {
      out += "  no version timed\n";
      continue;
    }
    const Timing& best = fastest(r);
    ++wins[best.version];
    out += fmt::format("  {:<10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>10} {:>9} {:>9}\n", "version",
                       "mean ms", "best ms", "max ms", "std ms", "TFLOP/s", "best TF/s", "% best",
                       "x " + baseline_label(r));
    for (const Timing& t : r.versions) {
      total_ms[t.version] += t.mean_ms;
      out += fmt::format(
          "  {:<10} {:>10.3f} {:>10.3f} {:>10.3f} {:>9.3f} {:>9.3f} {:>10.3f} {:>8.1f}% "
          "{:>9.2f}{}\n",
          t.version, t.mean_ms, t.best_ms, t.max_ms, t.std_ms, t.tflops, t.best_tflops,
          100 * best.mean_ms / t.mean_ms, r.baseline.mean_ms / t.mean_ms, &t == &best ? "  *" : "");
    }
    out += fmt::format(
        "  {:<10} {:>10.3f} {:>10.3f} {:>10.3f} {:>9.3f} {:>9.3f} {:>10.3f}   (baseline, same "
        "run)\n",
        r.baseline.version, r.baseline.mean_ms, r.baseline.best_ms, r.baseline.max_ms,
        r.baseline.std_ms, r.baseline.tflops, r.baseline.best_tflops);
  }
  if (results.empty() || versions.empty() || wins.empty()) return out;
  out += "\nwins:";
  for (const std::string& v : versions) out += fmt::format(" {} {}", v, wins[v]);
  std::string winner = versions.front();
  for (const std::string& v : versions) {
    if (wins[v] > wins[winner] || (wins[v] == wins[winner] && total_ms[v] < total_ms[winner])) {
      winner = v;
    }
  }
  const std::string& simplest = versions.front();
  // The winner's speed against the simplest version: the geometric mean over the
  // configurations where both were timed of the ratio of their mean times (each counts alike).
  double log_sum = 0;
  int both = 0;
  for (const ConfigBench& r : results) {
    const Timing* s = timing_of(r, simplest);
    const Timing* w = timing_of(r, winner);
    if (s == nullptr || w == nullptr) continue;
    log_sum += std::log(s->mean_ms / w->mean_ms);
    ++both;
  }
  out += fmt::format("\noverall winner: {} ({} of {} configurations, {:.3f} ms in all)\n", winner,
                     wins[winner], results.size(), total_ms[winner]);
  if (both == 0) {
    out += fmt::format("recommendation: take {}: {} was timed on none of its configurations\n",
                       winner, simplest);
    return out;
  }
  const double speedup = std::exp(log_sum / both);
  out += fmt::format("{} against {}: {:.3f}x (geometric mean of the time ratios{})\n", winner,
                     simplest, speedup,
                     both == static_cast<int>(results.size())
                         ? ""
                         : fmt::format(", over the {} configurations timing both", both));
  out += "recommendation: " + recommendation(simplest, winner, speedup) + "\n";
  return out;
}

std::string bench_json(const Family& f, std::span<const ConfigBench> results) {
  return bench_json(f.name, results);
}

std::string bench_json(std::string_view family, std::span<const ConfigBench> results) {
  std::string out;
  for (const ConfigBench& r : results) {
    std::vector<const Timing*> all;
    for (const Timing& t : r.versions) all.push_back(&t);
    all.push_back(&r.baseline);
    for (const Timing* t : all) {
      const nlohmann::json j = {{"family", family},
                                {"config", r.config.name},
                                {"m", r.config.m},
                                {"n", r.config.n},
                                {"k", r.config.k},
                                {"block", r.config.block},
                                {"version", t->version},
                                {"mean_ms", t->mean_ms},
                                {"best_ms", t->best_ms},
                                {"max_ms", t->max_ms},
                                {"std_ms", t->std_ms},
                                {"tflops", t->tflops},
                                {"best_tflops", t->best_tflops},
                                {"x_" + baseline_label(r), r.baseline.mean_ms / t->mean_ms}};
      out += j.dump() + "\n";
    }
  }
  return out;
}

}  // namespace meshtest::kernels
