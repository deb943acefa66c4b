// The fused-op test kit: a fused op against its module's unfused op sequence over the grid of
// modes, weights, program cache and trace, with e2e and device perf reports and the
// single-device chunked run. The kit's one public header (library meshtest::fused_kit, on the
// harness meshtest::gtest_main).
//
// A test file is three functions and one macro (mpi_tests/test_fused_qkv_rope.cpp):
//   FusedInputs qkv_rope_inputs(const FusedSetup& s);              // full inputs + placements
//   std::vector<Tensor> qkv_rope_reference(const FusedSetup& s, const std::vector<Tensor>& in);
//   std::vector<Tensor> qkv_rope_fused(const FusedSetup& s, const MeshDevice& mesh,
//                                      const std::vector<Tensor>& local);
//   MESHTEST_FUSED_OP_TESTS(qkv_rope, FusedOpCase{.name = "qkv_rope", .expected_pcc = 0.9999,
//       .model = qkv_rope_model, .checkpoint_tensors = {...}, .make_inputs = qkv_rope_inputs,
//       .reference = qkv_rope_reference, .fused = qkv_rope_fused});
// which defines three tests over every parameter set of fused_grid():
//   Fused/qkv_rope.qkv_rope_check/<param>          reference vs fused (PCC, and the error model
//       or atol) on the mesh, then e2e perf (10 warm-up + 100 measured calls) to
//       measurements.json;
//   Fused/qkv_rope.qkv_rope_device_perf/<param>    10 warm-up calls, then 10 calls between
//       signpost("start") / ("stop") with the profiler on; ops_perf_qkv_rope.csv and
//       measurements.json; prints total_kernel_duration_us and total_op_to_op_latency_us of
//       the cross-device aggregation (perf::aggregate);
//   Fused/qkv_rope.qkv_rope_single_device/<param>  device 0's chunk run alone (see
//       fused_single_device); skips when the fused op contains a CCL.
// <param> is fused_param_name: "<decode|prefill>_<seqlen>_<random|checkpoint>_<mode>" with
// mode cache_off, cache_on (eager, program cache off / on) or trace (trace implies the cache).
// Nothing about time is asserted: perf goes to the reports only.
//
// How close is close enough: a fused op adds the same terms as its unfused sequence in another
// order (and a TP form sums partials with a CCL), so its outputs lie within rounding error of
// the reference's, whose size depends on the reduction lengths (the prefill length, for
// attention), the bf16 roundings of the chain and the TP size, not on the machine. A case
// states them as an ErrorModel per parameter set (FusedOpCase::model, src/check/tolerance.hpp,
// docs/tolerances.md); atol / rtol remain for a case whose error is known in absolute terms.
//
// Trace mode captures the fused call in a perf::Trace and replays it: when every op of the
// call recorded a trace step (meshtest's CCLs and the traceable compute ops qkv_rope,
// sdpa_sinks and experts), the replay reruns the steps on the captured buffers without
// validation, planning or allocation (experts routes again), and is checked against the eager call
// bit for bit (the outputs overwritten with NaN first). A call with an op that is not traceable yet
// falls back to "replay is the eager call", said on device 0 ("trace replay is eager (no trace step
// for <ops>)") and on the e2e line ("replay is eager"); see capture_trace in fused_op.cpp.
//
// The mesh: case.mesh, or MESHTEST_FUSED_MESH=RxC when it is set (R*C started ranks: the
// seed's 2x4 at np 8 and 4x8 at np 32, TP over C on axis 1, the R rows alike), or the 1 x N mesh
// of every started rank (TP over N on axis 1). A case
// with a fixed mesh started on fewer ranks runs device 0's chunk of it on one device, saying so
// (chunked.hpp's MeshRun), when chunk_fallback is set; otherwise it skips.
//
// Environment (read on every rank; set it alike everywhere):
//   MESHTEST_FUSED_FULL=1    also runs prefill 1024 and 8192. Unset, those parameters skip with
//                            a message: they are too long for CI on 2 cores (CI runs decode 1
//                            and prefill 128).
//   MESHTEST_CHECKPOINT=DIR  (or the harness flag --meshtest_checkpoint=DIR, which wins) the
//                            checkpoint of the "checkpoint" parameters; unset, or lacking one
//                            of the case's checkpoint_tensors, they skip with the reason.
//   MESHTEST_REPORT_DIR=DIR  where reports go (default: perf::reports_root()/fused, i.e.
//                            reports/fused under the working directory: build/mpi_tests under
//                            ctest), as DIR/<op>/<RxC>/<param>/{check,device_perf,single_device}.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dist/testing/fused/chunked.hpp"
#include "src/check/compare.hpp"
#include "src/check/tolerance.hpp"
#include "src/models/checkpoint.hpp"
#include "src/perf/aggregate.hpp"
#include "src/perf/compare.hpp"
#include "src/perf/measurements.hpp"
#include "src/perf/op_record.hpp"

namespace meshtest::dist::testing {

enum class FusedMode { decode, prefill };
enum class FusedWeights { random, checkpoint };

/// One parameter set of the grid.
struct FusedParams {
  FusedMode mode = FusedMode::prefill;
  std::int64_t seqlen = 128;  ///< tokens: 1 in decode
  FusedWeights weights = FusedWeights::random;
  bool program_cache = true;  ///< forced on by trace
  bool trace = false;
};

/// "prefill_128_random_cache_on", "decode_1_checkpoint_trace".
std::string fused_param_name(const FusedParams& p);
/// fused_param_name(info.param), the gtest parameter name.
std::string fused_param_name_of(const ::testing::TestParamInfo<FusedParams>& info);
/// Throws Error for seqlen < 1 ("seqlen 0: ..."), or a decode seqlen other than 1.
void check_fused_params(const FusedParams& p);

/// The grid: decode 1 and prefill 128, 1024, 8192; random and checkpoint weights; cache_off,
/// cache_on and trace. Every set is listed; fused_skip_reason says which ones run here.
std::vector<FusedParams> fused_grid();

/// MESHTEST_PERF_EXPECTED=DIR: the perf expectations of the fused-op tests, recorded on this
/// machine, a tree laid out as the reports (<op>/<RxC>/<param>/device_perf/measurements.json)
/// with DIR/machine.json naming the machine (host, CPU, threads). When set, device perf is the
/// best of 10 windows of 10 calls, and:
///   - with MESHTEST_PERF_RECORD=1, each device_perf test writes its figures as the expectation
///     (margin 1.0: a 2x slowdown fails) and this machine to machine.json;
///   - else each device_perf test holds its measurements.json against the matching file, op by
///     op and in total kernel time (margin: the file's "margin", else MESHTEST_PERF_MARGIN,
///     default 0.1; one microsecond of slack per op) and fails on a regression, a missing file,
///     or a machine.json of another machine; each single_device test fails when it is slower
///     than the multi-device run's (same run) by more than MESHTEST_PERF_MARGIN, else 1.0; and
///     both skip, saying so, while DIR holds no machine.json.
/// Unset: nothing about time is asserted; the single_device test still prints its comparison
/// table. `./launch/meshtest test --perf [--record]` runs these checks (label perf), one test
/// at a time; the default suite never does.
std::optional<std::filesystem::path> fused_perf_baseline();

/// The mesh of a case without one of its own (FusedOpCase::mesh): MESHTEST_FUSED_MESH=RxC when
/// it is set (R*C must be the started ranks; the seed's 2x4 and 4x8, TP over C on axis 1, the
/// rows alike), else 1 x N over every started rank. Throws Error for a malformed value or a
/// size other than the world's, naming it.
MeshShape fused_default_mesh();

/// What make_inputs gets.
struct FusedSetup {
  FusedParams params = {};
  MeshShape mesh = {1, 1};                    ///< the configuration (TP size = mesh[1])
  const CheckpointDir* checkpoint = nullptr;  ///< set for FusedWeights::checkpoint
  std::uint64_t seed = 1;                     ///< for random weights and activations
};

/// The full inputs of one parameter set, and the placement of each fused output.
struct FusedInputs {
  std::vector<MeshInput> inputs = {};
  std::vector<Placements> outputs = {};  ///< one per output of `fused`
};

/// The module's unfused op sequence on one device: full (or chunk) inputs -> outputs. Sizes
/// that differ between the full op and a chunk (a TP device's heads) come from the shapes.
using FusedReferenceFn =
    std::function<std::vector<Tensor>(const FusedSetup& s, const std::vector<Tensor>& inputs)>;
/// The fused op on the mesh: this device's pieces of the inputs -> its pieces of the outputs.
/// Return the op's outputs moved, with fused_outputs(...): an initializer list (`return
/// {op(...)}`) copies them (time in e2e, and buffers a trace cannot replay into).
using FusedFn = std::function<std::vector<Tensor>(const FusedSetup& s, const MeshDevice& mesh,
                                                  const std::vector<Tensor>& local)>;

/// The vector of `outputs`, each moved in (no copy): `return fused_outputs(std::move(q), k());`.
template <class... T>
std::vector<Tensor> fused_outputs(T&&... outputs) {
  std::vector<Tensor> v;
  v.reserve(sizeof...(outputs));
  (v.push_back(std::forward<T>(outputs)), ...);
  return v;
}

/// The error model of a case's outputs for one parameter set: n (terms per output element
/// over the whole chain) and r (bf16 roundings read by a later op) may depend on the setup: the
/// keys of attention grow with the prefill length, a TP form adds the all_reduce's terms and
/// the rounding of its partials (s.mesh[1] devices), a checkpoint brings its own config.
using FusedModelFn = std::function<ErrorModel(const FusedSetup& s)>;

/// What a fused-op test supplies.
struct FusedOpCase {
  std::string name = {};                      ///< the op: "qkv_rope" ([A-Za-z0-9_]+)
  double expected_pcc = 0.99;                 ///< every output's PCC must be >= it; in (0, 1]
  std::optional<double> atol = std::nullopt;  ///< set: max |fused - reference| <= atol
  /// set (with atol): every element |fused - reference| <= atol + rtol |reference| (numpy's
  /// allclose) instead of the max-abs check; for outputs whose error grows with their magnitude
  std::optional<double> rtol = std::nullopt;
  /// set: every output within model(setup) (compare(reference, fused, model), with the tensor
  /// scale max |reference|: the case's inputs must be zero-mean random or same-signed, see
  /// src/check/tolerance.hpp); the model's dtype must be every output's. One model serves every
  /// output: give it the longest chain's n and r. Excludes atol and rtol.
  FusedModelFn model = {};
  std::vector<std::string> checkpoint_tensors = {};  ///< the op's tensors in a checkpoint
  std::function<FusedInputs(const FusedSetup&)> make_inputs = {};
  FusedReferenceFn reference = {};               ///< <op>_reference
  FusedFn fused = {};                            ///< <op>_fused
  std::optional<MeshShape> mesh = std::nullopt;  ///< unset: 1 x (started ranks)
  bool chunk_fallback = true;  ///< fixed mesh on fewer ranks: device 0's chunk (else skip)
};

/// Throws Error naming the field: an empty or bad name, expected_pcc outside (0, 1] (NaN
/// included), a negative or non-finite atol or rtol, an rtol without an atol, a model with an
/// atol or rtol, or a missing function.
void check_fused_case(const FusedOpCase& c);
/// check_fused_case(c), then (with a model) fused_model(c, s): the model of this setup.
void check_fused_case(const FusedOpCase& c, const FusedSetup& s);
/// c.model(s), checked: throws Error naming the case, the parameter set and the field for a
/// dtype that is not floating, terms < 0, roundings < 0 or a lambda that is not finite and > 0,
/// and when the case has no model.
ErrorModel fused_model(const FusedOpCase& c, const FusedSetup& s);

/// The checkpoint dir: the harness flag --meshtest_checkpoint=DIR (harness_flag), else env
/// MESHTEST_CHECKPOINT; empty if neither is set.
std::filesystem::path fused_checkpoint_dir();
/// Why `p` does not run here, or "": a prefill above 128 without MESHTEST_FUSED_FULL=1; the
/// checkpoint weights without a checkpoint dir, or with one lacking a checkpoint_tensors entry
/// (named). Throws Error when the dir is set but is not a readable checkpoint.
std::string fused_skip_reason(const FusedOpCase& c, const FusedParams& p);
/// check_fused_case(c, s), check_fused_params, then c.make_inputs(s); throws Error when the
/// number of output placements is 0.
FusedInputs make_fused_inputs(const FusedOpCase& c, const FusedSetup& s);

/// The fused op on this device's inputs, run as s.params says: eager with the program cache
/// off or on, or traced. Holds the cache switch for its lifetime. Trace mode: see
/// capture_trace in fused_op.cpp — a real replay when every op of the call has a trace step,
/// else the eager call; either is checked bit for bit against the captured call.
class FusedRunner {
 public:
  FusedRunner(const MeshDevice& mesh, const FusedFn& fused, const FusedSetup& s,
              std::vector<Tensor> local);
  ~FusedRunner();
  FusedRunner(const FusedRunner&) = delete;
  FusedRunner& operator=(const FusedRunner&) = delete;
  /// One call (an eager call or a replay); the outputs.
  std::vector<Tensor> run();
  /// Whether a replay is the eager call (an op without a trace step; see capture_trace).
  bool replay_is_eager() const;

  struct State;  ///< the implementation's (fused_op.cpp)

 private:
  std::unique_ptr<State> s_;
};

/// The outcome of a check: per output, the PCC comparison, and the error model's (with a
/// model), the max-abs (with atol) and the allclose (with rtol) comparisons.
struct FusedCheck {
  bool passed = true;
  std::vector<Comparison> pcc;
  std::vector<Comparison> model;
  std::vector<Comparison> atol;
  std::vector<Comparison> allclose;
};

/// Compares each output by PCC >= c.expected_pcc, and within fused_model(c, s) (with the
/// tensor scale), or max abs <= c.atol, or (with c.rtol) allclose(c.rtol, c.atol); on failure
/// records one gtest failure per failed comparison naming the label and the output. Local.
/// Throws Error when the counts or shapes differ, or an output's dtype is not the model's.
FusedCheck compare_fused_outputs(const FusedOpCase& c, const FusedSetup& s,
                                 const std::vector<Tensor>& expected,
                                 const std::vector<Tensor>& got, const std::string& label);
/// The same without the setup, for a case without a model; throws Error for a case with one
/// (its bound depends on the setup).
FusedCheck compare_fused_outputs(const FusedOpCase& c, const std::vector<Tensor>& expected,
                                 const std::vector<Tensor>& got, const std::string& label);

/// The check. Mesh runs (collective over run.mesh()): every device runs the fused op through
/// FusedRunner, the outputs are gathered (gather_full by their placements) and device 0
/// compares them with the reference on the full inputs. Chunk runs: the fused op on device 0's
/// chunks against the reference on the same chunks. `passed` is agreed on every device.
FusedCheck check_fused(const MeshRun& run, const FusedOpCase& c, const FusedInputs& in,
                       const FusedSetup& s);

/// DIR/<op>/<RxC>/<param>/<kind> (see the header comment).
std::filesystem::path fused_report_dir(const std::string& op, MeshShape mesh, const FusedParams& p,
                                       const std::string& kind);

/// Aggregates `records` (every device's, gathered) with perf::aggregate and writes
/// dir/ops_perf_<op>.csv and dir/measurements.json; prints "<op> <label>:
/// total_kernel_duration_us X total_op_to_op_latency_us Y (N devices, I iterations)".
/// Throws Error, writing nothing, when the records hold no "start" / "stop" signposts, and as
/// perf::aggregate does.
perf::Aggregate write_fused_device_perf(std::span<const perf::OpRecord> records,
                                        const std::string& op, const std::filesystem::path& dir,
                                        const std::string& label);

/// Device perf (collective over run.mesh() in mesh runs; one device in chunk runs): 10 warm-up
/// calls, then 10 calls between signposts with the profiler on (the best of 10 such windows when
/// MESHTEST_PERF_EXPECTED is set), records gathered to device 0, which writes the report to
/// `dir` (write_fused_device_perf) and records or checks the expectation (see
/// fused_perf_baseline). Returns the ops_perf path on device 0 (empty elsewhere).
std::filesystem::path fused_device_perf(const MeshRun& run, const FusedOpCase& c,
                                        const FusedInputs& in, const FusedSetup& s,
                                        const std::filesystem::path& dir);

/// The reason a single-device run of an op with these records is skipped: "contains a CCL
/// (<op>)" for the first record of type ccl, else "".
std::string ccl_skip_reason(std::span<const perf::OpRecord> records);

/// The outcome of fused_single_device.
struct SingleDeviceRun {
  std::string skipped;           ///< non-empty: why it did not run (GTEST_SKIP it)
  FusedCheck check;              ///< the chunk's outputs against the reference on the chunk
  perf::CompareResult shapes;    ///< compare_shapes(single-device report, multi-device report)
  std::filesystem::path report;  ///< the single-device ops_perf report
  /// Chunks ("name [shape]") whose shape no op of device 0 takes in the multi-device report
  /// (noted, not a failure: compare_shapes is the check).
  std::vector<std::string> unconfirmed = {};
};

/// The single-device chunked run of a fused op (device 0 works; the others return {} at once).
/// Reads `multi_report` (fused_device_perf's, of the same case and parameters): skips with
/// ccl_skip_reason when it holds a CCL. Otherwise takes device 0's chunk of every input
/// (chunk_of by its placements or shard function) and looks its shape up among the input
/// shapes of device 0's ops in the report (a chunk not found there is printed as a note and
/// listed in `unconfirmed`: a fused op whose own record is replaced by an inner op's does not
/// show its inputs); runs the fused op alone on a one-device mesh with the profiler on
/// (as fused_device_perf: warm-up, 10 signposted calls; report in `dir`), compares its outputs
/// with the reference on the chunk (compare_fused_outputs) and its report with device 0's of
/// `multi_report` by perf::compare_shapes (what `meshtest-report shapes` runs), recording a
/// gtest failure for each mismatch.
SingleDeviceRun fused_single_device(const MeshRun& run, const FusedOpCase& c, const FusedInputs& in,
                                    const FusedSetup& s, const std::filesystem::path& multi_report,
                                    const std::filesystem::path& dir);

/// The fixture MESHTEST_FUSED_OP_TESTS derives from: SetUp validates the case, skips the
/// parameter sets that do not run here (fused_skip_reason), opens the checkpoint and builds the
/// MeshRun (collectively); each run_* is one test.
class FusedOpTest : public ::testing::TestWithParam<FusedParams> {
 protected:
  virtual FusedOpCase make_case() const = 0;
  void SetUp() override;
  void TearDown() override;
  /// <op>_check: check_fused, then e2e perf to check/measurements.json.
  void run_check();
  /// <op>_device_perf: fused_device_perf to device_perf/.
  void run_device_perf();
  /// <op>_single_device: fused_device_perf to device_perf/, then fused_single_device to
  /// single_device/.
  void run_single_device();

 private:
  FusedSetup setup() const;
  FusedOpCase case_;
  std::optional<CheckpointDir> checkpoint_;
  std::optional<MeshRun> run_;
};

}  // namespace meshtest::dist::testing

/// Defines the fixture `op` (a FusedOpTest whose case is `...`), its tests op_check,
/// op_device_perf and op_single_device, and runs them over fused_grid() (prefix Fused).
#define MESHTEST_FUSED_OP_TESTS(op, ...)                                                      \
  class op : public ::meshtest::dist::testing::FusedOpTest {                                  \
   protected:                                                                                 \
    ::meshtest::dist::testing::FusedOpCase make_case() const override { return __VA_ARGS__; } \
  };                                                                                          \
  TEST_P(op, op##_check) { run_check(); }                                                     \
  TEST_P(op, op##_device_perf) { run_device_perf(); }                                         \
  TEST_P(op, op##_single_device) { run_single_device(); }                                     \
  INSTANTIATE_TEST_SUITE_P(Fused, op,                                                         \
                           ::testing::ValuesIn(::meshtest::dist::testing::fused_grid()),      \
                           ::meshtest::dist::testing::fused_param_name_of)
