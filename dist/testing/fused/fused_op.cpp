// The fused-op test kit: parameters, the grid, case checks, the runner (cache and trace
// modes) and the reference check.
#include "dist/testing/fused/fused_op.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "dist/mesh/agree.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "dist/shard/placement.hpp"
#include "dist/testing/harness/flags.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/program_cache.hpp"
#include "src/perf/report.hpp"
#include "src/perf/trace.hpp"

namespace meshtest::dist::testing {

namespace {

/// The prefill lengths that run without MESHTEST_FUSED_FULL.
constexpr std::int64_t kCiMaxSeqlen = 128;

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string_view(v) == "1";
}

[[maybe_unused]] const bool kCheckpointFlag = declare_harness_flag(
    {.name = "meshtest_checkpoint",
     .value = "DIR",
     .help = "the checkpoint of the fused-op tests' \"checkpoint\" parameters (else env "
             "MESHTEST_CHECKPOINT)"});

std::string mode_name(const FusedParams& p) {
  if (p.trace) return "trace";
  return p.program_cache ? "cache_on" : "cache_off";
}

}  // namespace

std::string fused_param_name(const FusedParams& p) {
  return fmt::format("{}_{}_{}_{}", p.mode == FusedMode::decode ? "decode" : "prefill", p.seqlen,
                     p.weights == FusedWeights::random ? "random" : "checkpoint", mode_name(p));
}

std::string fused_param_name_of(const ::testing::TestParamInfo<FusedParams>& info) {
  return fused_param_name(info.param);
}

void check_fused_params(const FusedParams& p) {
  MESHTEST_CHECK(p.seqlen >= 1,
                 "fused-op test: seqlen {}: need at least one token (decode 1, prefill >= 1)",
                 p.seqlen);
  MESHTEST_CHECK(p.mode != FusedMode::decode || p.seqlen == 1,
                 "fused-op test: decode with seqlen {}; decode runs one token", p.seqlen);
}

std::vector<FusedParams> fused_grid() {
  std::vector<FusedParams> grid;
  const std::pair<FusedMode, std::int64_t> lengths[] = {{FusedMode::decode, 1},
                                                        {FusedMode::prefill, 128},
                                                        {FusedMode::prefill, 1024},
                                                        {FusedMode::prefill, 8192}};
  for (const auto& [mode, seqlen] : lengths) {
    for (const FusedWeights w : {FusedWeights::random, FusedWeights::checkpoint}) {
      grid.push_back({mode, seqlen, w, false, false});
      grid.push_back({mode, seqlen, w, true, false});
      grid.push_back({mode, seqlen, w, true, true});
    }
  }
  return grid;
}

void check_fused_case(const FusedOpCase& c) {
  MESHTEST_CHECK(!c.name.empty() &&
                     c.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_") == std::string::npos,
                 "fused-op case: name '{}' must be [A-Za-z0-9_]+", c.name);
  MESHTEST_CHECK(c.expected_pcc > 0 && c.expected_pcc <= 1,
                 "fused-op case {}: expected_pcc {} is outside (0, 1]", c.name, c.expected_pcc);
  MESHTEST_CHECK(!c.atol || (std::isfinite(*c.atol) && *c.atol >= 0),
                 "fused-op case {}: atol {} must be finite and >= 0", c.name, c.atol.value_or(0));
  MESHTEST_CHECK(!c.rtol || (std::isfinite(*c.rtol) && *c.rtol >= 0 && c.atol),
                 "fused-op case {}: rtol {} must be finite and >= 0, and set with an atol", c.name,
                 c.rtol.value_or(0));
  MESHTEST_CHECK(!c.model || (!c.atol && !c.rtol),
                 "fused-op case {}: model and atol/rtol are both set; the model bounds every "
                 "output, set one or the other",
                 c.name);
  MESHTEST_CHECK(c.make_inputs && c.reference && c.fused,
                 "fused-op case {}: make_inputs, reference and fused must all be set", c.name);
}

void check_fused_case(const FusedOpCase& c, const FusedSetup& s) {
  check_fused_case(c);
  if (c.model) fused_model(c, s);
}

ErrorModel fused_model(const FusedOpCase& c, const FusedSetup& s) {
  MESHTEST_CHECK(static_cast<bool>(c.model), "fused-op case {}: has no model", c.name);
  const ErrorModel m = c.model(s);
  check_model(m, fmt::format("fused-op case {}: model({})", c.name, fused_param_name(s.params)));
  return m;
}

std::filesystem::path fused_checkpoint_dir() {
  if (std::optional<std::string> flag = harness_flag("meshtest_checkpoint")) return *flag;
  const char* env = std::getenv("MESHTEST_CHECKPOINT");
  return env == nullptr ? std::filesystem::path() : std::filesystem::path(env);
}

std::string fused_skip_reason(const FusedOpCase& c, const FusedParams& p) {
  if (p.mode == FusedMode::prefill && p.seqlen > kCiMaxSeqlen && !env_flag("MESHTEST_FUSED_FULL")) {
    return fmt::format(
        "prefill {} runs only with MESHTEST_FUSED_FULL=1 (CI runs decode 1 and "
        "prefill {})",
        p.seqlen, kCiMaxSeqlen);
  }
  if (p.weights != FusedWeights::checkpoint) return {};
  const std::filesystem::path dir = fused_checkpoint_dir();
  if (dir.empty()) {
    return "no checkpoint: set MESHTEST_CHECKPOINT=DIR or --meshtest_checkpoint=DIR";
  }
  const CheckpointDir ckpt = CheckpointDir::open(dir);
  for (const std::string& name : c.checkpoint_tensors) {
    if (!ckpt.contains(name)) {
      return fmt::format("checkpoint {} lacks {}'s tensor {}", dir.string(), c.name, name);
    }
  }
  return {};
}

FusedInputs make_fused_inputs(const FusedOpCase& c, const FusedSetup& s) {
  check_fused_case(c, s);
  check_fused_params(s.params);
  FusedInputs in = c.make_inputs(s);
  MESHTEST_CHECK(!in.outputs.empty(), "fused-op case {}: make_inputs gave no output placements",
                 c.name);
  return in;
}

// ---- FusedRunner ---------------------------------------------------------------------------

struct FusedRunner::State {
  const MeshDevice& mesh;
  FusedFn fused;
  FusedSetup setup;
  perf::ProgramCacheSwitch cache;
  std::vector<Tensor> local;
  std::unique_ptr<perf::Trace> trace;
  std::vector<Tensor*> kept;  // the trace's outputs (full replay only)
  bool replay_is_eager = true;
};

namespace {

/// The op codes of `records` (signposts left out) that `steps` (a trace's ops, in order) does
/// not cover, as "a, b"; "" when every op recorded a step.
std::string ops_without_steps(const std::vector<perf::OpRecord>& records,
                              std::vector<std::string> steps) {
  std::string missing;
  for (const perf::OpRecord& r : records) {
    if (r.op_type == perf::OpType::signpost) continue;
    const auto it = std::find(steps.begin(), steps.end(), r.op_code);
    if (it != steps.end()) {
      steps.erase(it);
    } else {
      missing += (missing.empty() ? "" : ", ") + r.op_code;
    }
  }
  return missing;
}

/// Trace mode. Captures one fused call in `s.trace` (the inputs as trace inputs, every output
/// kept) while the profiler records the ops it runs, and returns the captured (eager) outputs.
///   - Every op of the call recorded a trace step (meshtest's CCLs and the traceable compute
///     ops qkv_rope, sdpa_sinks and experts): the kept outputs are overwritten (NaN for floating
///     dtypes), the trace replayed, and the outputs must equal the eager ones bit for bit;
///     run() then replays (a real replay: no validation, planning or allocation).
///   - Otherwise (an op that is not traceable yet, or capture refused a step on an intermediate
///     the trace does not own): a replay IS the eager call, said once on device 0 ("replay is
///     eager", naming the ops without a step). run() calls the fused op again, and the check
///     is that the second call's outputs equal the captured ones bit for bit.
std::vector<Tensor> capture_trace(FusedRunner::State& s, const std::string& label) {
  s.trace = std::make_unique<perf::Trace>();
  std::string eager_reason;
  bool refused = false;
  try {
    const perf::Session session;
    s.trace->capture([&] {
      std::vector<Tensor> args = s.local;
      std::vector<Tensor> outs = s.fused(s.setup, s.mesh, args);
      for (Tensor& o : outs) s.kept.push_back(&s.trace->keep(std::move(o)));
      // Moved in after the call: a moved Tensor keeps its buffer, so the steps that read the
      // arguments read trace inputs.
      for (Tensor& a : args) s.trace->input(std::move(a));
    });
    const std::vector<perf::OpRecord> records = perf::records();
    const std::string missing = ops_without_steps(records, s.trace->ops());
    if (!missing.empty()) eager_reason = "no trace step for " + missing;
    if (s.trace->size() == 0 && eager_reason.empty()) eager_reason = "the call ran no op";
  } catch (const Error& e) {
    if (std::string(e.what()).find("does not own") == std::string::npos) throw;
    eager_reason = e.what();
    refused = true;
    s.kept.clear();
  }
  // Replay or eager, and whether the captured outputs are usable, are decided for the whole
  // mesh: a device that replays its CCL steps, or calls the op once more, while another does
  // not would run other collectives (and hang).
  if (!dist::all_ranks(s.mesh.comm(), eager_reason.empty()) && eager_reason.empty()) {
    eager_reason = "another device has no real replay";
  }
  if (!dist::all_ranks(s.mesh.comm(), !refused)) {
    refused = true;
    s.kept.clear();
  }
  if (!eager_reason.empty() && s.mesh.device_id() == 0) {
    fmt::print("{}: trace replay is eager ({})\n", label, eager_reason);
  }
  std::vector<Tensor> eager;
  if (!refused) {
    for (Tensor* t : s.kept) eager.push_back(*t);
  } else {
    eager = s.fused(s.setup, s.mesh, s.local);
  }
  s.replay_is_eager = !eager_reason.empty();
  std::vector<Tensor> replayed;
  if (s.replay_is_eager) {
    replayed = s.fused(s.setup, s.mesh, s.local);
  } else {
    for (Tensor* t : s.kept) {
      if (is_floating(t->dtype())) t->fill(std::numeric_limits<double>::quiet_NaN());
    }
    s.trace->replay();
    for (Tensor* t : s.kept) replayed.push_back(*t);
  }
  for (std::size_t i = 0; i < eager.size() && i < replayed.size(); ++i) {
    EXPECT_TRUE(replayed[i].bitwise_equal(eager[i]))
        << label << ": output " << i << " of the "
        << (s.replay_is_eager ? "second eager call (replay is eager)" : "trace replay")
        << " differs from the eager call's";
  }
  EXPECT_EQ(replayed.size(), eager.size()) << label << ": replay gave another output count";
  return eager;
}

}  // namespace

FusedRunner::FusedRunner(const MeshDevice& mesh, const FusedFn& fused, const FusedSetup& s,
                         std::vector<Tensor> local)
    : s_(new State{mesh,
                   fused,
                   s,
                   perf::ProgramCacheSwitch(s.params.program_cache || s.params.trace),
                   std::move(local),
                   nullptr,
                   {},
                   true}) {
  if (s.params.trace) capture_trace(*s_, fused_param_name(s.params));
}

FusedRunner::~FusedRunner() = default;

std::vector<Tensor> FusedRunner::run() {
  if (s_->trace == nullptr || s_->replay_is_eager) return s_->fused(s_->setup, s_->mesh, s_->local);
  s_->trace->replay();
  std::vector<Tensor> out;
  for (Tensor* t : s_->kept) out.push_back(*t);
  return out;
}

bool FusedRunner::replay_is_eager() const { return s_->replay_is_eager; }

// ---- the check -----------------------------------------------------------------------------

namespace {

FusedCheck compare_outputs(const FusedOpCase& c, const std::optional<ErrorModel>& model,
                           const std::vector<Tensor>& expected, const std::vector<Tensor>& got,
                           const std::string& label) {
  MESHTEST_CHECK(expected.size() == got.size(),
                 "{}: the reference gave {} outputs, the fused op {}", c.name, expected.size(),
                 got.size());
  FusedCheck r;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const Comparison pcc = compare(expected[i], got[i], Metric::pcc, c.expected_pcc);
    if (!pcc.passed) {
      ADD_FAILURE() << c.name << " (" << label << ") output " << i << ": fused differs from the "
                    << "reference: " << pcc.str();
    }
    r.passed = r.passed && pcc.passed;
    r.pcc.push_back(pcc);
    if (model) {
      MESHTEST_CHECK(expected[i].dtype() == model->dtype,
                     "fused-op case {}: model({}).dtype is {} but output {} is {}", c.name, label,
                     model->dtype, i, expected[i].dtype());
      const Comparison m = compare(expected[i], got[i], *model);  // S = max |reference|
      if (!m.passed) {
        ADD_FAILURE() << c.name << " (" << label << ") output " << i << ": fused differs from "
                      << "the reference by more than the error model allows: " << m.str();
      }
      r.passed = r.passed && m.passed;
      r.model.push_back(m);
    }
    if (c.atol) {
      const Comparison abs = compare(expected[i], got[i], Metric::max_abs, *c.atol);
      const bool max_abs_counts = !c.rtol;  // with rtol, max abs is reported, not checked
      if (max_abs_counts && !abs.passed) {
        ADD_FAILURE() << c.name << " (" << label << ") output " << i << ": fused differs from "
                      << "the reference by more than atol: " << abs.str();
      }
      r.passed = r.passed && (abs.passed || !max_abs_counts);
      r.atol.push_back(abs);
    }
    if (c.rtol) {
      const Comparison close = compare(expected[i], got[i], Tolerance{*c.rtol, *c.atol});
      if (!close.passed) {
        ADD_FAILURE() << c.name << " (" << label << ") output " << i << ": fused differs from "
                      << "the reference by more than atol + rtol |reference|: " << close.str();
      }
      r.passed = r.passed && close.passed;
      r.allclose.push_back(close);
    }
  }
  return r;
}

}  // namespace

FusedCheck compare_fused_outputs(const FusedOpCase& c, const FusedSetup& s,
                                 const std::vector<Tensor>& expected,
                                 const std::vector<Tensor>& got, const std::string& label) {
  std::optional<ErrorModel> model;
  if (c.model) model = fused_model(c, s);
  return compare_outputs(c, model, expected, got, label);
}

FusedCheck compare_fused_outputs(const FusedOpCase& c, const std::vector<Tensor>& expected,
                                 const std::vector<Tensor>& got, const std::string& label) {
  MESHTEST_CHECK(!c.model,
                 "fused-op case {}: its error model depends on the parameters; compare with "
                 "compare_fused_outputs(c, setup, expected, got, label)",
                 c.name);
  return compare_outputs(c, std::nullopt, expected, got, label);
}

FusedCheck check_fused(const MeshRun& run, const FusedOpCase& c, const FusedInputs& in,
                       const FusedSetup& s) {
  const FusedParams& p = s.params;
  check_fused_case(c, s);
  const MeshShape shape = run.shape();
  const std::string label = fmt::format("{} mesh {}x{}{}", fused_param_name(p), shape[0], shape[1],
                                        run.chunked() ? " (device 0's chunk)" : "");
  const std::vector<Tensor> local = chunks_of(in.inputs, shape, run.coord());
  const MeshDevice& mesh = run.mesh();
  FusedRunner runner(mesh, c.fused, s, local);
  std::vector<Tensor> got = runner.run();
  MESHTEST_CHECK(got.size() == in.outputs.size(),
                 "{}: the fused op gave {} outputs; make_inputs placed {}", c.name, got.size(),
                 in.outputs.size());
  if (run.chunked()) return compare_fused_outputs(c, s, c.reference(s, local), got, label);
  for (std::size_t i = 0; i < got.size(); ++i) got[i] = gather_full(got[i], mesh, in.outputs[i]);
  FusedCheck r;
  if (mesh.device_id() == 0) {
    std::vector<Tensor> full;
    for (const MeshInput& x : in.inputs) full.push_back(x.full);
    r = compare_fused_outputs(c, s, c.reference(s, full), got, label);
    for (std::size_t i = 0; i < r.pcc.size(); ++i) {
      std::string bound;
      if (!r.model.empty()) {
        bound = fmt::format(" {} {:.3g} (<= 1)", r.model[i].metric, r.model[i].value);
      } else if (!r.atol.empty() && r.allclose.empty()) {
        bound = fmt::format(" max_abs {:.3g} (<= {})", r.atol[i].value, *c.atol);
      } else if (!r.atol.empty()) {
        bound = fmt::format(" max_abs {:.3g}, {} elements beyond {} + {} |ref|", r.atol[i].value,
                            r.allclose[i].value, *c.atol, *c.rtol);
      }
      fmt::print("{} {} output {}: pcc {:.7f} (>= {}){}\n", c.name, label, i, r.pcc[i].value,
                 c.expected_pcc, bound);
    }
  }
  int passed = r.passed ? 1 : 0;
  MESHTEST_MPI(MPI_Bcast(&passed, 1, MPI_INT, 0, mesh.comm()));
  r.passed = passed != 0;
  return r;
}

std::filesystem::path fused_report_dir(const std::string& op, MeshShape mesh, const FusedParams& p,
                                       const std::string& kind) {
  const char* env = std::getenv("MESHTEST_REPORT_DIR");
  const std::filesystem::path root =
      env != nullptr && *env != '\0' ? std::filesystem::path(env) : perf::reports_root() / "fused";
  return root / op / fmt::format("{}x{}", mesh[0], mesh[1]) / fused_param_name(p) / kind;
}

}  // namespace meshtest::dist::testing
