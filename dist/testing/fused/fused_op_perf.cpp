// The fused-op test kit: device perf reports, the single-device chunked run and the fixture's
// tests (check + e2e, device perf, single device).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "dist/perf/e2e.hpp"
#include "dist/perf/gather.hpp"
#include "dist/testing/fused/fused_op.hpp"
#include "dist/testing/harness/harness.hpp"
#include "src/core/file.hpp"
#include "src/perf/machine.hpp"
#include "src/perf/ops_csv.hpp"
#include "src/perf/perf_check.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/report.hpp"

namespace meshtest::dist::testing {

namespace {

/// Calls before the measured ones, and measured calls, of device perf (the seed's 10 and 10).
constexpr int kPerfWarmup = 10;
constexpr int kPerfIterations = 10;
/// Windows of kPerfIterations calls each when perf is checked or recorded: the window with the
/// least total kernel time is the measurement, so that a busy machine's slow spells, which
/// only lengthen calls, fall in the other windows.
constexpr int kPerfWindows = 10;
/// The margin of the perf checks (docs/fused-op-tests.md, MESHTEST_PERF_EXPECTED): a recorded
/// expectation carries it, and the single-device run is held to it against the multi-device
/// one. On the 2-core development machine the best-of-windows figure of one op was up to 1.45x
/// its recorded value in later runs; a slowdown of 2x or more fails.
constexpr double kPerfCheckMargin = 1.0;

/// The e2e calls of the check tests: recorded, never asserted. Under AddressSanitizer (a
/// --sanitize build) the code runs several times slower and its times mean nothing, and the 110
/// calls of a prefill at 1x1 outlast the harness's 60 s deadline: a few calls run there.
#if defined(__has_feature)  // clang's test; GCC defines __SANITIZE_ADDRESS__
#if __has_feature(address_sanitizer)
#define MESHTEST_FUSED_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(MESHTEST_FUSED_ASAN)
constexpr E2eOptions kCheckE2e{.warmup = 1, .iterations = 5};
#else
constexpr E2eOptions kCheckE2e{};
#endif

/// What the environment asks of the perf checks (read alike on every rank).
struct PerfMode {
  std::optional<std::filesystem::path> expected;  ///< MESHTEST_PERF_EXPECTED
  bool record = false;                            ///< MESHTEST_PERF_RECORD=1
  int windows() const { return expected ? kPerfWindows : 1; }
  bool checks() const { return expected && !record; }
};

PerfMode perf_mode() {
  PerfMode m{.expected = fused_perf_baseline()};
  const char* rec = std::getenv("MESHTEST_PERF_RECORD");
  if (rec != nullptr && *rec != '\0' && std::string_view(rec) != "0") {
    MESHTEST_CHECK(std::string_view(rec) == "1", "MESHTEST_PERF_RECORD is '{}': expected 1 or 0",
                   rec);
    MESHTEST_CHECK(m.expected.has_value(),
                   "MESHTEST_PERF_RECORD=1 needs MESHTEST_PERF_EXPECTED=DIR: where to record");
    m.record = true;
  }
  return m;
}

/// DIR/machine.json: the machine the expectations in DIR were recorded on.
std::filesystem::path machine_file(const std::filesystem::path& dir) {
  return dir / "machine.json";
}

/// This device's records of the best of `windows` windows of kPerfIterations runs, each run
/// between signpost("start") and ("stop"), after kPerfWarmup unprofiled runs: every device's
/// records of the window with the least total kernel time, on device 0 (empty elsewhere).
/// Collective over `mesh`.
std::vector<perf::OpRecord> profile_best_window(const MeshDevice& mesh, FusedRunner& runner,
                                                int windows) {
  for (int i = 0; i < kPerfWarmup; ++i) runner.run();
  std::vector<perf::OpRecord> best;
  double best_total = 0;
  for (int w = 0; w < windows; ++w) {
    std::vector<perf::OpRecord> mine;
    {
      const perf::Session session;
      for (int i = 0; i < kPerfIterations; ++i) {
        perf::signpost("start");
        runner.run();
        perf::signpost("stop");
      }
      mine = perf::records();
    }
    std::vector<perf::OpRecord> all = gather_records(mesh, mine);
    if (mesh.device_id() != 0) continue;
    const double total = perf::aggregate(all).total_kernel_duration_us;
    if (best.empty() || total < best_total) {
      best = std::move(all);
      best_total = total;
    }
  }
  return best;
}

/// "name [shape]" of each chunk whose shape (W, Z, Y, X) is no input of an op of the lowest
/// device of `multi`.
std::vector<std::string> shapes_not_in_report(const std::vector<MeshInput>& inputs,
                                              const std::vector<Tensor>& chunk,
                                              const perf::OpsReport& multi) {
  const int first = std::min_element(multi.records.begin(), multi.records.end(),
                                     [](const perf::OpRecord& a, const perf::OpRecord& b) {
                                       return a.device_id < b.device_id;
                                     })
                        ->device_id;
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < chunk.size(); ++i) {
    const auto want = perf::wzyx(chunk[i].shape());
    const auto takes = [&](const perf::OpRecord& rec) {
      return rec.device_id == first &&
             std::any_of(rec.inputs.begin(), rec.inputs.end(),
                         [&](const perf::TensorInfo& t) { return perf::wzyx(t.shape) == want; });
    };
    if (std::none_of(multi.records.begin(), multi.records.end(), takes)) {
      missing.push_back(fmt::format("{} {}", inputs[i].name, chunk[i].shape()));
    }
  }
  return missing;
}

std::string run_label(const MeshRun& run, const FusedParams& p) {
  return fmt::format("{} mesh {}x{}{}", fused_param_name(p), run.shape()[0], run.shape()[1],
                     run.chunked() ? " (device 0's chunk)" : "");
}

/// `label`, with ", best of N windows" when there were several.
std::string windows_label(const std::string& label, int windows) {
  return windows > 1 ? fmt::format("{}, best of {} windows", label, windows) : label;
}

std::string run_label(const MeshRun& run, const FusedParams& p, int windows) {
  return windows_label(run_label(run, p), windows);
}

/// MESHTEST_PERF_MARGIN (default 0.1): the relative slack of the perf checks below.
double perf_margin() {
  const char* env = std::getenv("MESHTEST_PERF_MARGIN");
  if (env == nullptr || *env == '\0') return 0.1;
  char* end = nullptr;
  const double m = std::strtod(env, &end);
  MESHTEST_CHECK(end != env && *end == '\0' && std::isfinite(m) && m >= 0 && m <= 10,
                 "MESHTEST_PERF_MARGIN is '{}': expected a number in [0, 10] (0.1 = 10 %)", env);
  return m;
}

/// Holds `measured` against `expected` (measurements.json files) op by op and in total kernel
/// time, prints the table, and when `assert_it` fails the test on a regression beyond the
/// margin: `margin`, else the expectation's, else perf_margin().
void check_perf_against(const std::filesystem::path& expected,
                        const std::filesystem::path& measured, const std::string& what,
                        bool assert_it, std::optional<double> margin = std::nullopt) {
  const perf::PerfFigures e = perf::read_perf_figures(expected);
  // A microsecond of slack on each op: timer noise on ops of a few microseconds. The op-to-op
  // total (the host's gaps between a fused op's few calls) is the scheduler's, not the op's.
  const perf::PerfCheckOptions opt{.margin = margin.value_or(e.margin.value_or(perf_margin())),
                                   .min_us = 1.0,
                                   .op_to_op = false};
  const perf::PerfCheck c = perf::check_perf(e, perf::read_perf_figures(measured), opt);
  fmt::print("{}: check-perf {} against {}\n{}", what, measured.string(), expected.string(),
             c.table(opt));
  if (assert_it) {
    EXPECT_FALSE(c.regressed) << what << ": slower than " << expected << " beyond the margin "
                              << opt.margin << "\n"
                              << c.table(opt);
  }
}

/// Device 0's part of the perf checks of one device_perf report: records it as the
/// expectation (with kPerfCheckMargin, and this machine in DIR/machine.json), or holds it
/// against the recorded one, which must come from this machine.
void record_or_check(const PerfMode& mode, const std::filesystem::path& expected,
                     const std::filesystem::path& measured, const std::string& what) {
  const std::filesystem::path machine = machine_file(*mode.expected);
  if (mode.record) {
    std::filesystem::create_directories(expected.parent_path());
    perf::write_text_atomic(expected, perf::expectation_json(read_text_file(measured),
                                                             kPerfCheckMargin, measured.string()));
    perf::write_text_atomic(machine, perf::machine_json(perf::this_machine()));
    fmt::print("{}: recorded as the expectation {} (margin {})\n", what, expected.string(),
               kPerfCheckMargin);
    return;
  }
  const perf::Machine recorded = perf::read_machine(machine);
  const perf::Machine here = perf::this_machine();
  if (recorded != here) {
    ADD_FAILURE() << what << ": the expectations in " << mode.expected->string()
                  << " were recorded on " << perf::describe(recorded) << ", not on this machine ("
                  << perf::describe(here) << "): record this machine's first "
                  << "(./launch/meshtest test --perf --record)";
    return;
  }
  if (!std::filesystem::exists(expected)) {
    ADD_FAILURE() << what << ": no perf expectation at " << expected.string()
                  << ": record them again (./launch/meshtest test --perf --record)";
    return;
  }
  check_perf_against(expected, measured, what, true);
}

/// Why the perf checks cannot run (MESHTEST_PERF_EXPECTED names a tree with no machine.json:
/// nothing recorded there yet), or "" when they can or are not asked for.
std::string perf_skip_reason(const PerfMode& mode) {
  if (!mode.checks() || std::filesystem::exists(machine_file(*mode.expected))) return {};
  return fmt::format(
      "no perf expectations recorded in {} (no machine.json): ./launch/meshtest test --perf "
      "--record records this machine's",
      mode.expected->string());
}

}  // namespace

std::optional<std::filesystem::path> fused_perf_baseline() {
  const char* env = std::getenv("MESHTEST_PERF_EXPECTED");
  if (env == nullptr || *env == '\0') return std::nullopt;
  return std::filesystem::path(env);
}

perf::Aggregate write_fused_device_perf(std::span<const perf::OpRecord> records,
                                        const std::string& op, const std::filesystem::path& dir,
                                        const std::string& label) {
  const auto is = [](std::string_view name) {
    return [name](const perf::OpRecord& r) {
      return r.op_type == perf::OpType::signpost && r.attributes == name;
    };
  };
  MESHTEST_CHECK(std::any_of(records.begin(), records.end(), is("start")) &&
                     std::any_of(records.begin(), records.end(), is("stop")),
                 "{} device perf: the {} records hold no signpost(\"start\") / (\"stop\"); "
                 "profile the measured calls between them",
                 op, records.size());
  const perf::Aggregate a = perf::aggregate(records);
  std::filesystem::create_directories(dir);
  perf::write_text_atomic(dir / fmt::format("ops_perf_{}.csv", op), perf::ops_csv(records));
  perf::write_text_atomic(dir / "measurements.json", perf::measurements_json(op, a));
  fmt::print(
      "{} {}: total_kernel_duration_us {:.3f} total_op_to_op_latency_us {:.3f} ({} "
      "devices, {} iterations) -> {}\n",
      op, label, a.total_kernel_duration_us, a.total_op_to_op_latency_us, a.devices, a.iterations,
      dir.string());
  return a;
}

std::filesystem::path fused_device_perf(const MeshRun& run, const FusedOpCase& c,
                                        const FusedInputs& in, const FusedSetup& s,
                                        const std::filesystem::path& dir) {
  check_fused_case(c, s);
  const PerfMode mode = perf_mode();
  const MeshDevice& mesh = run.mesh();
  FusedRunner runner(mesh, c.fused, s, chunks_of(in.inputs, run.shape(), run.coord()));
  const std::vector<perf::OpRecord> all = profile_best_window(mesh, runner, mode.windows());
  if (mesh.device_id() != 0) return {};
  write_fused_device_perf(all, c.name, dir, run_label(run, s.params, mode.windows()));
  if (mode.expected) {
    // The expectations tree has the reports' layout: <op>/<RxC>/<param>/device_perf/.
    const std::filesystem::path expected =
        *mode.expected / c.name / fmt::format("{}x{}", run.shape()[0], run.shape()[1]) /
        fused_param_name(s.params) / "device_perf" / "measurements.json";
    record_or_check(mode, expected, dir / "measurements.json",
                    fmt::format("{} {}", c.name, run_label(run, s.params)));
  }
  return dir / fmt::format("ops_perf_{}.csv", c.name);
}

std::string ccl_skip_reason(std::span<const perf::OpRecord> records) {
  for (const perf::OpRecord& r : records) {
    if (r.op_type == perf::OpType::ccl) {
      return fmt::format(
          "the fused op contains a CCL ({}): device 0's chunk run alone would not "
          "be device 0's computation",
          r.op_code);
    }
  }
  return {};
}

SingleDeviceRun fused_single_device(const MeshRun& run, const FusedOpCase& c, const FusedInputs& in,
                                    const FusedSetup& s, const std::filesystem::path& multi_report,
                                    const std::filesystem::path& dir) {
  check_fused_case(c, s);
  if (run.mesh().device_id() != 0) return {};
  const perf::OpsReport multi = perf::read_ops_csv(multi_report);
  SingleDeviceRun r;
  r.skipped = ccl_skip_reason(multi.records);
  if (!r.skipped.empty()) return r;

  // Device 0's chunk by the placements, its shapes looked up in the report.
  const std::vector<Tensor> chunk = chunks_of(in.inputs, run.shape(), {0, 0});
  r.unconfirmed = shapes_not_in_report(in.inputs, chunk, multi);
  if (!r.unconfirmed.empty()) {
    fmt::print(
        "{}: note: device 0's chunk of {} ({}) is no op's input in {}: its shape comes from "
        "the placements alone (a fused op that records an inner op in its place?)\n",
        c.name, r.unconfirmed.size() == 1 ? "input" : "inputs", fmt::join(r.unconfirmed, ", "),
        multi_report.string());
  }

  const std::string label = fmt::format("{} single device, chunk of {}x{}",
                                        fused_param_name(s.params), run.shape()[0], run.shape()[1]);
  const PerfMode mode = perf_mode();
  const MeshDevice one = single_device_mesh();
  FusedRunner runner(one, c.fused, s, chunk);
  write_fused_device_perf(profile_best_window(one, runner, mode.windows()), c.name, dir,
                          windows_label(label, mode.windows()));
  r.report = dir / fmt::format("ops_perf_{}.csv", c.name);
  // Its perf against the multi-device run's (device 0's chunk there, the slowest device in
  // the aggregate), both measured in this run: printed, and asserted in the perf checks
  // (MESHTEST_PERF_EXPECTED set, not recording).
  const char* margin = std::getenv("MESHTEST_PERF_MARGIN");
  check_perf_against(multi_report.parent_path() / "measurements.json", dir / "measurements.json",
                     label + " vs the multi-device run", mode.checks(),
                     margin != nullptr && *margin != '\0' ? perf_margin() : kPerfCheckMargin);
  r.check = compare_fused_outputs(c, s, c.reference(s, chunk), runner.run(), label);
  r.shapes = perf::compare_shapes(perf::read_ops_csv(r.report), multi);
  if (!r.shapes.ok) {
    std::string problems;
    for (const std::string& s : r.shapes.problems) problems += "\n  " + s;
    ADD_FAILURE() << c.name << " (" << label << "): the single-device shapes differ from device 0's"
                  << " (meshtest-report shapes " << r.report.string() << " "
                  << multi_report.string() << "): " << r.shapes.summary << problems;
  }
  fmt::print("{} {}: pcc {:.7f}; shapes vs device 0: {}\n", c.name, label,
             r.check.pcc.empty() ? 0.0 : r.check.pcc.front().value, r.shapes.summary);
  return r;
}

// ---- FusedOpTest ---------------------------------------------------------------------------

MeshShape fused_default_mesh() {
  const int world = world_size();
  const char* env = std::getenv("MESHTEST_FUSED_MESH");
  if (env == nullptr || *env == '\0') return {1, world};
  const std::string s(env);
  const auto x = s.find('x');
  int r = 0, c = 0;
  try {
    std::size_t used_r = 0, used_c = 0;
    if (x != std::string::npos) {
      r = std::stoi(s.substr(0, x), &used_r);
      c = std::stoi(s.substr(x + 1), &used_c);
    }
    if (x == std::string::npos || used_r != x || used_c != s.size() - x - 1) r = c = 0;
  } catch (const std::exception&) {
    r = c = 0;
  }
  MESHTEST_CHECK(r > 0 && c > 0, "MESHTEST_FUSED_MESH is '{}': expected RxC with positive R and C",
                 s);
  MESHTEST_CHECK(r * c == world,
                 "MESHTEST_FUSED_MESH={} has {} devices but {} ranks are running (start R*C ranks)",
                 s, r * c, world);
  return {r, c};
}

void FusedOpTest::SetUp() {
  case_ = make_case();
  check_fused_case(case_);
  const FusedParams& p = GetParam();
  if (const std::string why = fused_skip_reason(case_, p); !why.empty()) GTEST_SKIP() << why;
  if (p.weights == FusedWeights::checkpoint) {
    checkpoint_.emplace(CheckpointDir::open(fused_checkpoint_dir()));
  }
  run_.emplace(case_.mesh.value_or(fused_default_mesh()),
               FixedMeshOptions{.chunk_fallback = case_.chunk_fallback});
}

void FusedOpTest::TearDown() { run_.reset(); }

FusedSetup FusedOpTest::setup() const {
  return {.params = GetParam(),
          .mesh = run_->shape(),
          .checkpoint = checkpoint_ ? &*checkpoint_ : nullptr};
}

void FusedOpTest::run_check() {
  MESHTEST_MESH_RUN_OR_SKIP(*run_);
  const FusedParams& p = GetParam();
  const FusedSetup s = setup();
  const FusedInputs in = make_fused_inputs(case_, s);
  check_fused(*run_, case_, in, s);
  // e2e: never asserted; to check/measurements.json.
  const MeshDevice& mesh = run_->mesh();
  FusedRunner runner(mesh, case_.fused, s, chunks_of(in.inputs, run_->shape(), run_->coord()));
  const perf::E2eStats e2e = time_e2e(
      mesh, [&] { runner.run(); }, kCheckE2e);
  if (mesh.device_id() != 0) return;
  const std::filesystem::path dir = fused_report_dir(case_.name, run_->shape(), p, "check");
  std::filesystem::create_directories(dir);
  perf::Aggregate none;  // no profiled ops here: device_perf has them
  none.devices = mesh.size();
  perf::write_text_atomic(dir / "measurements.json",
                          perf::measurements_json(case_.name, none, e2e));
  fmt::print(
      "{} {}: e2e mean {:.2f} us (min {:.2f}, max {:.2f}, std {:.2f}) over {} calls after "
      "{} warm-up{} -> {}\n",
      case_.name, run_label(*run_, p), e2e.mean_us, e2e.min_us, e2e.max_us, e2e.std_us,
      e2e.iterations, e2e.warmup, runner.replay_is_eager() && p.trace ? " (replay is eager)" : "",
      dir.string());
}

void FusedOpTest::run_device_perf() {
  MESHTEST_MESH_RUN_OR_SKIP(*run_);
  if (const std::string why = perf_skip_reason(perf_mode()); !why.empty()) GTEST_SKIP() << why;
  const FusedParams& p = GetParam();
  const FusedSetup s = setup();
  fused_device_perf(*run_, case_, make_fused_inputs(case_, s), s,
                    fused_report_dir(case_.name, run_->shape(), p, "device_perf"));
}

void FusedOpTest::run_single_device() {
  MESHTEST_MESH_RUN_OR_SKIP(*run_);
  if (const std::string why = perf_skip_reason(perf_mode()); !why.empty()) GTEST_SKIP() << why;
  const FusedParams& p = GetParam();
  const FusedSetup s = setup();
  const FusedInputs in = make_fused_inputs(case_, s);
  const std::filesystem::path multi = fused_device_perf(
      *run_, case_, in, s, fused_report_dir(case_.name, run_->shape(), p, "device_perf"));
  const SingleDeviceRun r = fused_single_device(
      *run_, case_, in, s, multi, fused_report_dir(case_.name, run_->shape(), p, "single_device"));
  if (!r.skipped.empty()) GTEST_SKIP() << r.skipped;
}

}  // namespace meshtest::dist::testing
