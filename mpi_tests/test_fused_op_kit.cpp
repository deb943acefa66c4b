// test_fused_op_kit: the fused-op test kit (dist/testing/fused/fused_op.hpp) and the single-device
// chunked run (chunked.hpp) on toy ops whose results are known: a wrong fused op fails the PCC
// (and a scaled one the atol and the error model) check, the model passes an error within its
// bound and fails one above it, with n taken from the parameters, bad expected_pcc / seqlen /
// models / reports are clear Errors, the
// single-device variant skips an op with a CCL and matches device 0's shapes otherwise, chunk_of
// equals distribute, a test written for a 2x4 mesh falls back to device 0's chunk, and trace
// mode replays a traceable op (all_reduce, sdpa_sinks) but runs an untraceable one eagerly, and
// the harness flag --meshtest_checkpoint wins over MESHTEST_CHECKPOINT.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <span>

#include "dist/ccl/all_reduce.hpp"
#include "dist/testing/fused/fused_op.hpp"
#include "dist/testing/harness/flags.hpp"
#include "dist/testing/harness/harness.hpp"
#include "mpi_tests/support/scoped_env.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/models/checkpoint.hpp"
#include "src/ops/elementwise.hpp"
#include "src/ops/sdpa_sinks.hpp"
#include "src/perf/machine.hpp"
#include "src/perf/perf_check.hpp"
#include "src/perf/report.hpp"
#include "tests/support/expect_error.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest::dist::testing {
namespace {

using test_support::expect_error;

constexpr FusedParams kPrefill{.mode = FusedMode::prefill, .seqlen = 6};

/// out = x + x on [seqlen, 8] f32, x sharded on dim 1 over axis 1 (and dim 0 over axis 0);
/// `fused` may be replaced by a wrong one.
FusedOpCase doubling_case(FusedFn fused = {}) {
  FusedOpCase c{
      .name = "doubling",
      .expected_pcc = 0.9999,
      .atol = 1e-6,
      .make_inputs =
          [](const FusedSetup& s) {
            const Placements p{Shard{0}, Shard{1}};
            return FusedInputs{
                .inputs = {{.name = "x",
                            .full = random_normal({s.params.seqlen, 8}, DType::f32, {.seed = 5}),
                            .placements = p}},
                .outputs = {p}};
          },
      .reference = [](const FusedSetup&,
                      const std::vector<Tensor>& in) { return std::vector{add(in[0], in[0])}; },
      .fused = [](const FusedSetup&, const MeshDevice&,
                  const std::vector<Tensor>& in) { return std::vector{add(in[0], in[0])}; }};
  if (fused) c.fused = std::move(fused);
  return c;
}

FusedSetup setup_for(const MeshRun& run, FusedParams p = kPrefill) {
  return {.params = p, .mesh = run.shape()};
}

/// A wrong op: random values of the output's shape, checked by PCC only (no atol).
FusedOpCase random_output_case() {
  FusedOpCase c =
      doubling_case([](const FusedSetup&, const MeshDevice&, const std::vector<Tensor>& in) {
        return std::vector{random_normal(in[0].shape(), DType::f32, {.seed = 99})};
      });
  c.atol = std::nullopt;
  return c;
}

/// check_fused of `c` on `run`, expecting one gtest failure containing `needle` on the device
/// that compares (device 0 of the mesh).
FusedCheck expect_check_fails(const MeshRun& run, const FusedOpCase& c, const std::string& needle) {
  const FusedSetup s = setup_for(run);
  const FusedInputs in = make_fused_inputs(c, s);
  FusedCheck r;
  if (run.mesh().device_id() == 0) {
    EXPECT_NONFATAL_FAILURE(r = check_fused(run, c, in, s), needle);
  } else {
    r = check_fused(run, c, in, s);
  }
  EXPECT_FALSE(r.passed);
  return r;
}

class FusedKit : public MeshTest {
 protected:
  MeshRun line_run() const { return MeshRun({1, world_size()}); }
};

TEST_F(FusedKit, RightFusedOpPassesInEveryMode) {
  const MeshRun run = line_run();
  for (const bool trace : {false, true}) {
    for (const bool cache : {false, true}) {
      FusedSetup s = setup_for(run, {.seqlen = 7, .program_cache = cache, .trace = trace});
      const FusedCheck r =
          check_fused(run, doubling_case(), make_fused_inputs(doubling_case(), s), s);
      EXPECT_TRUE(r.passed) << fused_param_name(s.params);
    }
  }
}

TEST_F(FusedKit, WrongFusedOpFailsPcc) {
  const FusedCheck r =
      expect_check_fails(line_run(), random_output_case(), "fused differs from the reference");
  if (world_rank() == 0) {
    EXPECT_LT(r.pcc.at(0).value, 0.5);
  }
}

TEST_F(FusedKit, ScaledFusedOpPassesPccButFailsAtol) {
  // PCC cannot see a scale error (x instead of 2x); the atol check does.
  const FusedOpCase c = doubling_case(
      [](const FusedSetup&, const MeshDevice&, const std::vector<Tensor>& in) { return in; });
  const FusedCheck r = expect_check_fails(line_run(), c, "by more than atol");
  if (world_rank() == 0) {
    EXPECT_GT(r.pcc.at(0).value, 0.99999);
  }
}

TEST_F(FusedKit, RtolAllowsAnErrorThatScalesWithTheMagnitude) {
  // 2x (1 + 2^-7): an error of 2^-7 |reference|, far above atol 1e-6 on large elements.
  const FusedFn relative = [](const FusedSetup&, const MeshDevice&, const std::vector<Tensor>& in) {
    Tensor out = add(in[0], in[0]);
    for (float& v : std::span(out.data<float>(), static_cast<std::size_t>(out.numel())))
      v *= 1.0F + 0x1p-7F;
    return fused_outputs(std::move(out));
  };
  FusedOpCase c = doubling_case(relative);
  expect_check_fails(line_run(), c, "by more than atol");
  c.rtol = 0x1p-6;  // twice the error: passes
  const FusedSetup s = setup_for(line_run());
  const FusedCheck ok = check_fused(line_run(), c, make_fused_inputs(c, s), s);
  EXPECT_TRUE(ok.passed);
  if (world_rank() == 0) {
    EXPECT_GT(ok.atol.at(0).value, 1e-3);  // max abs still reported, no longer checked
    EXPECT_EQ(ok.allclose.at(0).value, 0);
  }
  c.rtol = 0x1p-9;  // a quarter of the error: fails, naming the rule
  const FusedCheck bad = expect_check_fails(line_run(), c, "by more than atol + rtol |reference|");
  if (world_rank() == 0) {
    EXPECT_GT(bad.allclose.at(0).value, 0);
  }
}

/// f32 with n = the setup's seqlen (a model whose bound grows with the prefill length), against
/// a reference in another order.
ErrorModel seqlen_model(const FusedSetup& s) {
  return {.dtype = DType::f32, .terms = s.params.seqlen, .reference = Reference::other_order};
}

/// doubling_case checked under seqlen_model instead of atol.
FusedOpCase doubling_model_case(FusedFn fused = {}) {
  FusedOpCase c = doubling_case(std::move(fused));
  c.atol = std::nullopt;
  c.model = seqlen_model;
  return c;
}

TEST_F(FusedKit, ModelPassesAnErrorWithinItsBoundAndFailsOneAbove) {
  // Local: compare_fused_outputs on a reference and a copy with one element moved by a
  // fraction of its bound (the scale is max |reference|, that element's magnitude).
  const FusedOpCase c = doubling_model_case();
  const Tensor want = random_normal({6, 8}, DType::f32, {.seed = 5});
  std::int64_t at = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    if (std::abs(want.item(i)) > std::abs(want.item(at))) at = i;
  }
  const double e = want.item(at);
  const FusedSetup short_run{.params = kPrefill};  // n = 6
  FusedSetup long_run = short_run;
  long_run.params.seqlen = 16 * kPrefill.seqlen;  // n = 96: sqrt(16) = 4x the sum's part
  const double bound = error_bound(seqlen_model(short_run), std::abs(e), e);
  const auto moved = [&](double by) {
    Tensor got = want;
    got.data<float>()[at] = static_cast<float>(e + (e < 0 ? -by : by));
    return std::vector{got};
  };
  const FusedCheck within = compare_fused_outputs(c, short_run, {want}, moved(0.5 * bound), "0.5");
  EXPECT_TRUE(within.passed);
  ASSERT_EQ(within.model.size(), 1u);
  EXPECT_NEAR(within.model[0].value, 0.5, 0.05);  // |error| / bound, f32 rounding of got aside
  FusedCheck above;
  EXPECT_NONFATAL_FAILURE(
      above = compare_fused_outputs(c, short_run, {want}, moved(2 * bound), "2"),
      "by more than the error model allows");
  EXPECT_FALSE(above.passed);
  EXPECT_NEAR(above.model.at(0).value, 2.0, 0.05);
  EXPECT_EQ(above.model[0].worst_index, at);
  // The same error at prefill 96: n is the parameters', and its bound is wider.
  const FusedCheck longer = compare_fused_outputs(c, long_run, {want}, moved(2 * bound), "96");
  EXPECT_TRUE(longer.passed) << longer.model.at(0).str();
  EXPECT_LT(longer.model[0].value, 1.0);
}

TEST_F(FusedKit, ScaledFusedOpFailsTheModel) {
  // The model in check_fused: the right op passes in every mode, x instead of 2x fails it
  // (PCC cannot see the scale).
  const MeshRun run = line_run();
  for (const bool trace : {false, true}) {
    const FusedSetup s = setup_for(run, {.seqlen = 7, .trace = trace});
    const FusedOpCase c = doubling_model_case();
    const FusedCheck r = check_fused(run, c, make_fused_inputs(c, s), s);
    EXPECT_TRUE(r.passed) << fused_param_name(s.params);
    if (world_rank() == 0) {
      EXPECT_EQ(r.model.size(), 1u);  // device 0 compares
    }
  }
  const FusedOpCase scaled = doubling_model_case(
      [](const FusedSetup&, const MeshDevice&, const std::vector<Tensor>& in) { return in; });
  const FusedCheck r = expect_check_fails(line_run(), scaled, "by more than the error model");
  if (world_rank() == 0) {
    EXPECT_GT(r.pcc.at(0).value, 0.99999);
    EXPECT_GT(r.model.at(0).value, 1e3);
  }
}

TEST_F(FusedKit, TheDefaultMeshFollowsMeshtestFusedMesh) {
  // Unset: 1 x N. Set: RxC over the started ranks (the seed's 2x4 and 4x8); a malformed value or
  // a size other than the world's names it. The job's own value comes back afterwards.
  const char* was = std::getenv("MESHTEST_FUSED_MESH");
  const std::string saved = was != nullptr ? was : "";
  const int n = world_size();
  unsetenv("MESHTEST_FUSED_MESH");
  EXPECT_EQ(fused_default_mesh(), (MeshShape{1, n}));
  setenv("MESHTEST_FUSED_MESH", fmt::format("{}x1", n).c_str(), 1);
  EXPECT_EQ(fused_default_mesh(), (MeshShape{n, 1}));
  setenv("MESHTEST_FUSED_MESH", "2x", 1);
  expect_error([] { (void)fused_default_mesh(); }, {"MESHTEST_FUSED_MESH is '2x': expected RxC"});
  setenv("MESHTEST_FUSED_MESH", fmt::format("1x{}", n + 1).c_str(), 1);
  expect_error([] { (void)fused_default_mesh(); },
               {fmt::format("has {} devices but {} ranks are running", n + 1, n)});
  if (was != nullptr) {
    setenv("MESHTEST_FUSED_MESH", saved.c_str(), 1);
  } else {
    unsetenv("MESHTEST_FUSED_MESH");
  }
}

TEST_F(FusedKit, BadModelIsAnError) {
  const FusedSetup s{.params = kPrefill};
  const std::string at = "doubling: model(prefill_6_random_cache_on)";
  const auto with = [](ErrorModel m) {
    FusedOpCase c = doubling_model_case();
    c.model = [m](const FusedSetup&) { return m; };
    return c;
  };
  expect_error([&] { check_fused_case(with({.terms = -1}), s); }, {at, ".terms is -1"});
  expect_error([&] { make_fused_inputs(with({.terms = -1}), s); }, {at, ".terms is -1"});
  expect_error([&] { check_fused_case(with({.roundings = -1}), s); }, {at, ".roundings is -1"});
  for (const double lambda : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    expect_error([&] { check_fused_case(with({.lambda = lambda}), s); }, {at, ".lambda is"});
  }
  expect_error([&] { check_fused_case(with({.dtype = DType::i32}), s); }, {at, ".dtype is i32"});
  EXPECT_NO_THROW(check_fused_case(with({.terms = 1}), s));
  // A model with atol: which one bounds the output?
  FusedOpCase both = doubling_model_case();
  both.atol = 1e-6;
  expect_error([&] { check_fused_case(both); }, {"doubling", "model and atol/rtol are both set"});
  // A bf16 model on an f32 output would be 2^16 times too loose.
  const Tensor x = random_normal({2, 3}, DType::f32, {.seed = 1});
  expect_error([&] { compare_fused_outputs(with({.dtype = DType::bf16}), s, {x}, {x}, "x"); },
               {"doubling", "model(x).dtype is bf16 but output 0 is f32"});
  // The bound depends on the setup: the overload without one refuses a model.
  expect_error([&] { compare_fused_outputs(doubling_model_case(), {x}, {x}, "x"); },
               {"doubling", "compare_fused_outputs(c, setup"});
  FusedOpCase none = doubling_case();
  expect_error([&] { fused_model(none, s); }, {"doubling", "has no model"});
}

TEST_F(FusedKit, BadExpectedPccIsAnError) {
  for (const double pcc : {0.0, -0.5, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    FusedOpCase c = doubling_case();
    c.expected_pcc = pcc;
    expect_error([&] { check_fused_case(c); }, {"doubling", "expected_pcc", "outside (0, 1]"});
  }
  FusedOpCase c = doubling_case();
  c.expected_pcc = 1.0;
  EXPECT_NO_THROW(check_fused_case(c));
  c.rtol = -0.5;
  expect_error([&] { check_fused_case(c); }, {"rtol -0.5", "finite and >= 0"});
  c.rtol = 0.01;
  c.atol = std::nullopt;
  expect_error([&] { check_fused_case(c); }, {"rtol 0.01", "set with an atol"});
  c.atol = -1;
  c.rtol = std::nullopt;
  expect_error([&] { check_fused_case(c); }, {"atol -1"});
}

TEST_F(FusedKit, SeqlenZeroIsAnError) {
  const FusedOpCase c = doubling_case();
  expect_error([&] { make_fused_inputs(c, {.params = {.seqlen = 0}}); }, {"seqlen 0"});
  expect_error([&] { make_fused_inputs(c, {.params = {.mode = FusedMode::decode, .seqlen = 2}}); },
               {"decode with seqlen 2"});
}

TEST_F(FusedKit, ReportWithoutSignpostsIsAnError) {
  perf::OpRecord r;
  r.op_code = "doubling";
  r.end_ns = 10;
  const test_support::TempDir tmp("fused_kit");
  expect_error([&] { write_fused_device_perf(std::vector{r}, "doubling", tmp.path(), "x"); },
               {"doubling device perf", "no signpost(\"start\")"});
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "ops_perf_doubling.csv"));
}

TEST_F(FusedKit, GridNamesAndSkips) {
  const std::vector<FusedParams> grid = fused_grid();
  std::set<std::string> names;
  for (const FusedParams& p : grid) {
    names.insert(fused_param_name(p));
    EXPECT_TRUE(!p.trace || p.program_cache) << "trace implies the program cache";
  }
  EXPECT_EQ(grid.size(), 4u * 2u * 3u);
  EXPECT_EQ(names.size(), grid.size());
  EXPECT_TRUE(names.contains("decode_1_random_cache_off"));
  EXPECT_TRUE(names.contains("prefill_8192_checkpoint_trace"));

  const FusedOpCase c = doubling_case();
  if (std::getenv("MESHTEST_FUSED_FULL") == nullptr) {
    EXPECT_NE(fused_skip_reason(c, {.seqlen = 1024}).find("MESHTEST_FUSED_FULL=1"),
              std::string::npos);
  }
  EXPECT_EQ(fused_skip_reason(c, {.seqlen = 128}), "");
}

TEST_F(FusedKit, CheckpointSkipsNameTheMissingTensor) {
  // Every rank writes the tiny model to its own temp dir and points MESHTEST_CHECKPOINT there.
  const char* before = std::getenv("MESHTEST_CHECKPOINT");
  if (before != nullptr) GTEST_SKIP() << "MESHTEST_CHECKPOINT is set by the caller";
  const FusedParams p{.weights = FusedWeights::checkpoint};
  FusedOpCase c = doubling_case();
  EXPECT_NE(fused_skip_reason(c, p).find("no checkpoint"), std::string::npos);
  const test_support::TempDir tmp("fused_ckpt");
  const GptOssConfig cfg = GptOssConfig::tiny();
  write_checkpoint(tmp.path(), cfg, init_transformer_weights(cfg, DType::f32, RandomInit{1}),
                   false);
  ::setenv("MESHTEST_CHECKPOINT", tmp.path().c_str(), 1);
  c.checkpoint_tensors = {"block.0.attn.qkv.weight"};
  EXPECT_EQ(fused_skip_reason(c, p), "");
  c.checkpoint_tensors.push_back("block.7.attn.fused_qkv");
  EXPECT_NE(fused_skip_reason(c, p).find("lacks doubling's tensor block.7.attn.fused_qkv"),
            std::string::npos);
  ::unsetenv("MESHTEST_CHECKPOINT");
}

TEST_F(FusedKit, CheckpointFlagWinsOverTheEnvironment) {
  if (harness_flag("meshtest_checkpoint") || std::getenv("MESHTEST_CHECKPOINT") != nullptr) {
    GTEST_SKIP() << "the caller gives a checkpoint";
  }
  std::string program = "test_fused_op_kit";
  std::string flag = "--meshtest_checkpoint=/flag/dir";
  char* with_flag[] = {program.data(), flag.data(), nullptr};
  char* without_flag[] = {program.data(), nullptr};
  int argc = 2;
  detail::take_harness_flags(argc, with_flag);  // as run_all_tests takes the command line
  EXPECT_EQ(argc, 1);
  EXPECT_EQ(fused_checkpoint_dir(), "/flag/dir");
  ::setenv("MESHTEST_CHECKPOINT", "/env/dir", 1);
  EXPECT_EQ(fused_checkpoint_dir(), "/flag/dir");
  argc = 1;
  detail::take_harness_flags(argc, without_flag);
  EXPECT_EQ(fused_checkpoint_dir(), "/env/dir");
  ::unsetenv("MESHTEST_CHECKPOINT");
  EXPECT_TRUE(fused_checkpoint_dir().empty());
}

TEST_F(FusedKit, ChunkOfEqualsDistribute) {
  const Tensor x = random_normal({7, 5, 3}, DType::f32, {.seed = 2});
  for (const MeshShape shape : mesh_shapes(world_size())) {
    const MeshDevice mesh(std::vector<int>{shape[0], shape[1]});
    for (const Placements& p :
         {Placements{Shard{0}, Shard{1}}, Placements{Shard{1}, Shard{1}},
          Placements{Replicate{}, Shard{-1}}, Placements{Partial{}, Shard{0}}, kReplicated}) {
      EXPECT_TRUE(chunk_of(x, p, shape, mesh.coord()).bitwise_equal(distribute(x, mesh, p)))
          << str(p) << " on " << mesh.str() << " device " << mesh.device_id();
    }
  }
  expect_error([&] { chunk_of(x, kReplicated, {2, 4}, {2, 0}); }, {"outside a 2x4 mesh"});
}

TEST_F(FusedKit, SingleDeviceRunMatchesDeviceZeroShapes) {
  const MeshRun run = line_run();
  const FusedSetup s = setup_for(run, {.seqlen = 9});
  const FusedInputs in = make_fused_inputs(doubling_case(), s);
  const test_support::TempDir tmp("fused_single");
  const auto multi = fused_device_perf(run, doubling_case(), in, s, tmp.path() / "multi");
  const SingleDeviceRun r =
      fused_single_device(run, doubling_case(), in, s, multi, tmp.path() / "single");
  if (world_rank() != 0) return;
  EXPECT_EQ(r.skipped, "");
  EXPECT_TRUE(r.check.passed);
  EXPECT_TRUE(r.shapes.ok) << r.shapes.summary;
  EXPECT_EQ(r.unconfirmed, std::vector<std::string>{});  // add took x's chunk
  const perf::OpsReport single = perf::read_ops_csv(r.report);
  ASSERT_FALSE(single.records.empty());
  // Device 0's chunk of [9, 8] over 1 x N on dim 1: [9, ceil(8 / N)].
  const auto chunk = split_range(8, world_size(), 0).size;
  for (const perf::OpRecord& rec : single.records) {
    if (rec.op_code == "add") {
      EXPECT_EQ(perf::wzyx(rec.inputs.at(0).shape), perf::wzyx(Shape({9, chunk})));
    }
  }
}

// The perf checks' expectations belong to the machine that recorded them. Only what does not
// depend on the clock is asserted here: what recording writes, that a check against far slower
// made expectations passes, and that another machine's or a missing expectation fails.
TEST_F(FusedKit, PerfExpectationsAreRecordedAndHeldOnThisMachineOnly) {
  const MeshRun run = line_run();
  const FusedSetup s = setup_for(run, {.seqlen = 9});
  const FusedInputs in = make_fused_inputs(doubling_case(), s);
  const test_support::TempDir tmp("fused_perf_expected");
  const std::filesystem::path dir = tmp.path() / "expected";
  const std::filesystem::path expected = dir / "doubling" / fmt::format("1x{}", world_size()) /
                                         fused_param_name(s.params) / "device_perf" /
                                         "measurements.json";
  const test_support::ScopedEnv at("MESHTEST_PERF_EXPECTED", dir.string());
  {
    const test_support::ScopedEnv record("MESHTEST_PERF_RECORD", "1");
    fused_device_perf(run, doubling_case(), in, s, tmp.path() / "recorded");
  }
  const bool first = world_rank() == 0;
  if (first) {
    ASSERT_TRUE(std::filesystem::exists(expected)) << expected;
    EXPECT_EQ(perf::read_perf_figures(expected).margin, 1.0);
    EXPECT_EQ(perf::read_machine(dir / "machine.json"), perf::this_machine());
    // Far slower expectations: the check passes whatever this machine's clock does.
    std::ifstream in(expected);
    nlohmann::json slow = nlohmann::json::parse(in);
    for (auto& op : slow["ops"]) op["kernel_duration_us"] = 1e9;
    slow["total_kernel_duration_us"] = 1e9;
    slow["total_op_to_op_latency_us"] = 1e9;
    perf::write_text_atomic(expected, slow.dump(2));
  }
  fused_device_perf(run, doubling_case(), in, s, tmp.path() / "checked");
  EXPECT_FALSE(HasFailure());

  // Expectations recorded on another machine: a failure naming both machines.
  perf::Machine elsewhere = perf::this_machine();
  elsewhere.host = "elsewhere";
  if (first) perf::write_text_atomic(dir / "machine.json", perf::machine_json(elsewhere));
  if (first) {
    EXPECT_NONFATAL_FAILURE(fused_device_perf(run, doubling_case(), in, s, tmp.path() / "other"),
                            "were recorded on host elsewhere");
  } else {
    fused_device_perf(run, doubling_case(), in, s, tmp.path() / "other");
  }
  // This machine's, but no expectation for the case: a failure naming the file.
  if (first) {
    perf::write_text_atomic(dir / "machine.json", perf::machine_json(perf::this_machine()));
    std::filesystem::remove(expected);
    EXPECT_NONFATAL_FAILURE(fused_device_perf(run, doubling_case(), in, s, tmp.path() / "none"),
                            "no perf expectation at");
  } else {
    fused_device_perf(run, doubling_case(), in, s, tmp.path() / "none");
  }
}

/// x placed Partial(sum) over axis 1; the fused op all_reduces it back (one CCL, traceable).
FusedOpCase all_reduce_case() {
  FusedOpCase c = doubling_case();
  c.make_inputs = [](const FusedSetup& s) {
    return FusedInputs{
        .inputs = {{.name = "x",
                    .full = random_normal({s.params.seqlen, 4}, DType::f32, {.seed = 3}),
                    .placements = placements_1d(Partial{})}},
        .outputs = {kReplicated}};
  };
  c.reference = [](const FusedSetup&, const std::vector<Tensor>& in) { return in; };
  c.fused = [](const FusedSetup&, const MeshDevice& mesh, const std::vector<Tensor>& in) {
    return fused_outputs(all_reduce(mesh, in[0], {.axis = 1}));
  };
  return c;
}

TEST_F(FusedKit, TraceReplaysATraceableOpBitForBit) {
  const MeshRun run = line_run();
  const FusedOpCase c = all_reduce_case();
  const FusedSetup s = setup_for(run, {.seqlen = 5, .trace = true});
  const FusedInputs in = make_fused_inputs(c, s);
  FusedRunner runner(run.mesh(), c.fused, s, chunks_of(in.inputs, run.shape(), run.coord()));
  EXPECT_FALSE(runner.replay_is_eager());  // every op of the call (one all_reduce) has a step
  EXPECT_TRUE(runner.run().at(0).bitwise_equal(in.inputs[0].full));
  EXPECT_TRUE(check_fused(run, c, in, s).passed);
  // A compute op has no step: its replay is the eager call.
  const FusedRunner eager(run.mesh(), doubling_case().fused, s, {in.inputs[0].full});
  EXPECT_TRUE(eager.replay_is_eager());
}

TEST_F(FusedKit, TraceReplaysATraceableComputeOp) {
  // sdpa_sinks records a compute step: trace mode replays it (no eager fallback), and the
  // replay after the inputs' capture equals the captured call bit for bit (capture_trace).
  const MeshRun run = line_run();
  const FusedSetup s = setup_for(run, {.seqlen = 5, .trace = true});
  const FusedFn fused = [](const FusedSetup&, const MeshDevice&, const std::vector<Tensor>& in) {
    return fused_outputs(sdpa_sinks(in[0], in[1], in[2], in[3]));
  };
  std::vector<Tensor> in{random_normal({5, 2, 2, 4}, DType::f32, {.seed = 1}),
                         random_normal({5, 2, 4}, DType::f32, {.seed = 2}),
                         random_normal({5, 2, 4}, DType::f32, {.seed = 3}),
                         random_normal({4}, DType::f32, {.seed = 4})};
  const Tensor expected = sdpa_sinks(in[0], in[1], in[2], in[3]);
  FusedRunner runner(run.mesh(), fused, s, in);
  EXPECT_FALSE(runner.replay_is_eager());
  EXPECT_TRUE(runner.run().at(0).bitwise_equal(expected));
}

TEST_F(FusedKit, ReplayOrEagerIsDecidedForTheWholeMesh) {
  // Device 0 passes a copy of its input to the all_reduce (a buffer the trace does not own, so
  // its capture is refused); the others could replay. Every device must fall back to eager
  // calls, or device 0 would call all_reduce while the others replay theirs (a hang).
  const MeshRun run = line_run();
  const FusedSetup s = setup_for(run, {.seqlen = 5, .trace = true});
  const FusedFn fused = [](const FusedSetup&, const MeshDevice& mesh,
                           const std::vector<Tensor>& in) {
    const Tensor copy = in[0];
    return fused_outputs(all_reduce(mesh, mesh.device_id() == 0 ? copy : in[0], {.axis = 1}));
  };
  const Tensor x = random_normal({5, 4}, DType::f32, {.seed = 6});
  const Tensor expected = all_reduce(run.mesh(), x, {.axis = 1});
  FusedRunner runner(run.mesh(), fused, s, {x});
  EXPECT_TRUE(runner.replay_is_eager());
  EXPECT_TRUE(runner.run().at(0).bitwise_equal(expected));
}

TEST_F(FusedKit, SingleDeviceSkipsAnOpWithACcl) {
  const FusedOpCase c = all_reduce_case();
  const MeshRun run = line_run();
  const FusedSetup s = setup_for(run);
  const FusedInputs in = make_fused_inputs(c, s);
  EXPECT_TRUE(check_fused(run, c, in, s).passed);
  const test_support::TempDir tmp("fused_ccl");
  const auto multi = fused_device_perf(run, c, in, s, tmp.path() / "multi");
  const SingleDeviceRun r = fused_single_device(run, c, in, s, multi, tmp.path() / "single");
  if (world_rank() != 0) return;
  EXPECT_NE(r.skipped.find("contains a CCL (all_reduce)"), std::string::npos) << r.skipped;
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "single"));
}

TEST_F(FusedKit, FixedMeshOnFewerRanksRunsDeviceZerosChunk) {
  if (world_size() >= 8) GTEST_SKIP() << "the 2x4 mesh fits: no fallback to test";
  EXPECT_EQ(MeshRun({2, 4}).kind(), MeshRunKind::skip);
  EXPECT_NE(MeshRun({2, 4}).skip_reason().find("needs 8 ranks"), std::string::npos);
  if (world_rank() == 0) ::testing::internal::CaptureStdout();
  const MeshRun run({2, 4}, {.chunk_fallback = true});
  if (world_rank() != 0) {
    EXPECT_EQ(run.kind(), MeshRunKind::idle);
    return;
  }
  EXPECT_NE(::testing::internal::GetCapturedStdout().find(
                "running device 0's chunk of 2x4 on one device"),
            std::string::npos);
  ASSERT_TRUE(run.chunked());
  EXPECT_EQ(run.mesh().size(), 1);
  const FusedSetup s = setup_for(run, {.seqlen = 6});
  const FusedInputs in = make_fused_inputs(doubling_case(), s);
  // Device 0 of 2x4 holds rows [0, 3) (axis 0) and columns [0, 2) (axis 1) of x [6, 8].
  EXPECT_EQ(run.local(in.inputs[0]).shape(), Shape({3, 2}));
  EXPECT_TRUE(check_fused(run, doubling_case(), in, s).passed);
  expect_check_fails(run, random_output_case(), "device 0's chunk");
}

TEST_F(FusedKit, FixedMeshOnMoreRanksUsesTheFirstOnes) {
  const int n = (world_size() + 1) / 2;  // 1 of 1, 1 of 2, 2 of 4
  const MeshRun run({1, n});
  if (world_rank() >= n) {
    EXPECT_EQ(run.kind(), MeshRunKind::idle);
    return;
  }
  ASSERT_EQ(run.kind(), MeshRunKind::mesh);
  EXPECT_EQ(run.mesh().size(), n);
  EXPECT_EQ(run.mesh().device_id(), world_rank());
  const FusedSetup s = setup_for(run);
  EXPECT_TRUE(check_fused(run, doubling_case(), make_fused_inputs(doubling_case(), s), s).passed);
}

/// Any mesh test written for 2x4 can opt in to the fallback (FixedMeshTest, chunked.hpp).
class TwoByFour : public FixedMeshTest {
 protected:
  MeshShape mesh_shape() const override { return {2, 4}; }
  FixedMeshOptions mesh_options() const override { return {.chunk_fallback = true}; }
};

TEST_F(TwoByFour, PlainMeshTestRunsOnTheMeshOrDeviceZerosChunk) {
  MESHTEST_FIXED_MESH_OR_SKIP();
  const Placements p{Shard{0}, Shard{1}};
  const std::vector<MeshInput> in{
      {.name = "x", .full = random_normal({6, 8}, DType::f32, {.seed = 8}), .placements = p}};
  const ReferenceFn twice = [](const std::vector<Tensor>& x) { return add(x[0], x[0]); };
  const ShardedFn fused = [](const MeshDevice&, const std::vector<Tensor>& x) {
    return add(x[0], x[0]);
  };
  if (!run().chunked()) {
    EXPECT_TRUE(
        expect_matches_single_device(run().mesh(), {{in[0].full, p}}, twice, fused, p).passed);
    return;
  }
  EXPECT_TRUE(expect_chunk_matches(run().shape(), in, twice, fused).passed);
  const ShardedFn wrong = [](const MeshDevice&, const std::vector<Tensor>& x) { return x[0]; };
  Comparison c;
  EXPECT_NONFATAL_FAILURE(c = expect_chunk_matches(run().shape(), in, twice, wrong,
                                                   {.metric = Metric::max_abs, .threshold = 0}),
                          "device 0's chunk of a 2x4 mesh, run alone, differs");
  EXPECT_FALSE(c.passed);
}

}  // namespace
}  // namespace meshtest::dist::testing
