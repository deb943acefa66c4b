// The MPI test harness in-process: verdict rule, timeouts, command-line flags, the crash text,
// mesh fixtures, single-device checks (the failure paths run as child jobs in
// test_harness_jobs.cpp).
#include <fmt/format.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "dist/ccl/all_reduce.hpp"
#include "dist/testing/harness/fixtures.hpp"
#include "dist/testing/harness/flags.hpp"
#include "dist/testing/harness/harness.hpp"
#include "dist/testing/harness/single_device.hpp"
#include "dist/testing/harness/state.hpp"
#include "dist/testing/harness/verdict.hpp"
#include "mpi_tests/support/scale.hpp"
#include "src/core/error.hpp"

namespace meshtest::dist::testing {
namespace {

#define HAS_TEXT(text, needle) EXPECT_NE((text).find(needle), std::string::npos) << (text)
using detail::Arrival;
using detail::Status;
using detail::TestPart;

// ---------------------------------------------------------------- the verdict rule (in-process)

Arrival arrival(Status s, std::vector<TestPart> parts = {}) {
  Arrival a;
  a.status = s;
  a.parts = std::move(parts);
  return a;
}

TEST(VerdictRule, FailedIfAnyRankFailedWithEveryFailure) {
  const TestPart f1{
      .rank = 1, .skip = false, .file = "a.cpp", .line = 3, .message = "m1", .also = {}};
  const TestPart s2{
      .rank = 2, .skip = true, .file = "a.cpp", .line = 4, .message = "s2", .also = {}};
  const TestPart f3{.rank = 3, .skip = false, .file = "", .line = -1, .message = "m3", .also = {}};
  const auto v = detail::agree({arrival(Status::passed), arrival(Status::failed, {f1}),
                                arrival(Status::skipped, {s2}), arrival(Status::failed, {f3})});
  EXPECT_EQ(v.status, Status::failed);
  ASSERT_EQ(v.parts.size(), 2u);
  EXPECT_EQ(v.parts[0].message, "m1");
  EXPECT_EQ(v.parts[1].message, "m3");
  EXPECT_EQ(v.summary, "failed on ranks 1, 3 of 4 (reported by rank 0)");
}

TEST(VerdictRule, TheSameErrorOnSeveralRanksIsReportedOnce) {
  // A CCL's agreed error: the same text but for the "[rank r] " that dist errors start with.
  const auto part = [](int r, const std::string& m) {
    return TestPart{.rank = r, .skip = false, .file = "", .line = -1, .message = m, .also = {}};
  };
  const auto err = [](int r) { return fmt::format("uncaught: [rank {}] all_reduce: desync", r); };
  const auto v = detail::agree({arrival(Status::failed, {part(0, err(0))}),
                                arrival(Status::failed, {part(1, err(1))}),
                                arrival(Status::failed, {part(2, "another failure")}),
                                arrival(Status::failed, {part(3, err(3))})});
  ASSERT_EQ(v.parts.size(), 2u);
  EXPECT_EQ(v.parts[0].message, err(0));
  EXPECT_EQ(v.parts[0].also, "1, 3");
  EXPECT_EQ(v.parts[1].also, "");
  EXPECT_EQ(detail::format_part(v.parts[0], 4),
            "[rank 0/4] unknown file: Failure (the same on ranks 1, 3)\n" + err(0) + "\n");
  EXPECT_EQ(v.summary, "failed on ranks 0, 1, 2, 3 of 4 (reported by rank 0)");
}

TEST(VerdictRule, SkippedIfAnyRankSkippedAndNoneFailed) {
  const TestPart s1{
      .rank = 1, .skip = true, .file = "a.cpp", .line = 9, .message = "why", .also = {}};
  const TestPart s2{
      .rank = 2, .skip = true, .file = "a.cpp", .line = 9, .message = "why2", .also = {}};
  const auto v = detail::agree(
      {arrival(Status::passed), arrival(Status::skipped, {s1}), arrival(Status::skipped, {s2})});
  EXPECT_EQ(v.status, Status::skipped);
  ASSERT_EQ(v.parts.size(), 1u);
  EXPECT_EQ(v.parts[0].rank, 1);
  EXPECT_EQ(v.skipped, (std::vector<int>{1, 2}));
  EXPECT_EQ(v.summary, "skipped on ranks 1, 2 of 3: why");
}

TEST(VerdictRule, PassedOnlyIfEveryRankPassed) {
  EXPECT_EQ(detail::agree({arrival(Status::passed), arrival(Status::passed)}).status,
            Status::passed);
  EXPECT_EQ(detail::agree({arrival(Status::passed)}).status, Status::passed);
}

TEST(VerdictRule, FinishFailsIfAnyRankReturnedNonZero) {
  std::vector<Arrival> all(3);
  EXPECT_EQ(detail::agree_finish(all).exit_code, 0);
  all[2].exit_code = 1;
  EXPECT_EQ(detail::agree_finish(all).exit_code, 1);
}

TEST(VerdictRule, PartFormatNamesRankFileAndLine) {
  EXPECT_EQ(detail::format_part({.rank = 1,
                                 .skip = false,
                                 .file = "x.cpp",
                                 .line = 7,
                                 .message = "Expected 1",
                                 .also = {}},
                                4),
            "[rank 1/4] x.cpp:7: Failure\nExpected 1\n");
  EXPECT_EQ(
      detail::format_part(
          {.rank = 0, .skip = true, .file = "", .line = -1, .message = "no gpu\n", .also = {}}, 2),
      "[rank 0/2] unknown file: Skipped\nno gpu\n");
}

TEST(Timeouts, EnvSecondsParsesAndRejects) {
  using std::chrono::milliseconds;
  ::setenv("MESHTEST_TEST_PARSE", "2.5", 1);
  EXPECT_EQ(detail::env_seconds("MESHTEST_TEST_PARSE", milliseconds(1)), milliseconds(2500));
  for (const char* bad : {"0", "-1", "abc", "3s", "inf"}) {
    ::setenv("MESHTEST_TEST_PARSE", bad, 1);
    EXPECT_THROW(detail::env_seconds("MESHTEST_TEST_PARSE", milliseconds(1)), Error) << bad;
  }
  ::unsetenv("MESHTEST_TEST_PARSE");
  EXPECT_EQ(detail::env_seconds("MESHTEST_TEST_PARSE", milliseconds(7)), milliseconds(7));
}

TEST(Timeouts, PerTestOverrideAppliesToTheRunningTestOnly) {
  EXPECT_EQ(detail::current_timeout(), default_test_timeout());
  MESHTEST_TIMEOUT(1.5);
  EXPECT_EQ(detail::current_timeout(), std::chrono::milliseconds(1500));
  set_test_timeout(std::chrono::seconds(90));
  EXPECT_EQ(detail::current_timeout(), std::chrono::seconds(90));
}

TEST(Timeouts, NextTestStartsWithTheDefaultAgain) {
  EXPECT_EQ(detail::current_timeout(), default_test_timeout());
}

// ------------------------------------------------------------- flags and the crash text

[[maybe_unused]] const bool kProbeDeclared = declare_harness_flag(
    {.name = "meshtest_harness_probe", .value = "TEXT", .help = "read by test_harness only"});

/// detail::take_harness_flags on `args` (the program name first); the arguments it leaves.
std::vector<std::string> take(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int argc = static_cast<int>(args.size());
  detail::take_harness_flags(argc, argv.data());
  EXPECT_EQ(argv[argc], nullptr);
  return {argv.begin(), argv.begin() + argc};
}

bool asks_for_help(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return detail::asks_for_help(static_cast<int>(args.size()), argv.data());
}

TEST(Flags, TakesTheDeclaredFlagsAndLeavesTheRest) {
  const std::vector<std::string> left = take(
      {"prog", "a", "--meshtest_harness_probe=x", "--other=1", "--meshtest_harness_probe=y=z"});
  EXPECT_EQ(left, (std::vector<std::string>{"prog", "a", "--other=1"}));
  EXPECT_EQ(harness_flag("meshtest_harness_probe"), "y=z");  // the last one, '=' kept
  EXPECT_EQ(take({"prog"}), std::vector<std::string>{"prog"});
  EXPECT_EQ(harness_flag("meshtest_harness_probe"), std::nullopt);
}

TEST(Flags, MalformedOrUnknownFlagsAreErrors) {
  for (const char* bad : {"--meshtest_harness_probe", "--meshtest_harness_probe=",
                          "--meshtest_nosuch=1", "--meshtest-harness-probe=1", "--meshtest"}) {
    EXPECT_THROW(take({"prog", bad}), Error) << bad;
  }
  try {
    take({"prog", "--meshtest_nosuch=1"});
    ADD_FAILURE() << "an unknown flag was taken";
  } catch (const Error& e) {
    HAS_TEXT(std::string(e.what()), "unknown flag '--meshtest_nosuch=1'");
    HAS_TEXT(std::string(e.what()), "--meshtest_harness_probe=TEXT");
  }
  EXPECT_THROW(harness_flag("meshtest_nosuch"), Error);
  EXPECT_THROW(declare_harness_flag({.name = "meshtest_harness_probe", .value = "X", .help = "h"}),
               Error);
  for (const char* bad : {"checkpoint", "meshtest_", "meshtest_Upper", "meshtest-dash"}) {
    EXPECT_THROW(declare_harness_flag({.name = bad, .value = "X", .help = "h"}), Error) << bad;
  }
}

TEST(Flags, HelpListsTheDeclaredFlags) {
  HAS_TEXT(detail::harness_flags_help(), "--meshtest_harness_probe=TEXT");
  HAS_TEXT(detail::harness_flags_help(), "read by test_harness only");
  EXPECT_TRUE(asks_for_help({"prog", "--help"}));
  EXPECT_TRUE(asks_for_help({"prog", "--gtest_nosuch=1"}));  // GoogleTest prints its help too
  EXPECT_FALSE(asks_for_help({"prog", "--meshtest_harness_probe=1", "x"}));
  EXPECT_FALSE(asks_for_help({"prog", "--gtest_internal_run_death_test=x"}));
}

TEST(CrashText, IsTheRunningTestsActivity) {
  EXPECT_EQ(detail::activity(), "test CrashText.IsTheRunningTestsActivity");
  EXPECT_EQ(std::string(detail::activity_for_signal()), detail::activity());
}

// ------------------------------------------------------------------------------ mesh fixtures

TEST(MeshShapes, EveryFactorisation) {
  using S = std::vector<MeshShape>;
  EXPECT_EQ(mesh_shapes(1), (S{{1, 1}}));
  EXPECT_EQ(mesh_shapes(7), (S{{1, 7}, {7, 1}}));
  EXPECT_EQ(mesh_shapes(8), (S{{1, 8}, {2, 4}, {4, 2}, {8, 1}}));
  EXPECT_THROW(mesh_shapes(0), Error);
}

TEST(MeshShapes, AboveEightRanksTheLinesAndTheSquarestShapes) {  // mpi_tests/support/scale.hpp
  using S = std::vector<MeshShape>;
  using test_support::mesh_shapes_at_scale;
  EXPECT_EQ(mesh_shapes_at_scale(mesh_shapes(8)), mesh_shapes(8));
  EXPECT_EQ(mesh_shapes_at_scale(mesh_shapes(7)), mesh_shapes(7));
  EXPECT_EQ(mesh_shapes_at_scale(mesh_shapes(12)), (S{{1, 12}, {3, 4}, {4, 3}, {12, 1}}));
  EXPECT_EQ(mesh_shapes_at_scale(mesh_shapes(16)), (S{{1, 16}, {4, 4}, {16, 1}}));
  EXPECT_EQ(mesh_shapes_at_scale(mesh_shapes(32)), (S{{1, 32}, {4, 8}, {8, 4}, {32, 1}}));
  EXPECT_EQ(mesh_shapes_at_scale(mesh_shapes(13)), (S{{1, 13}, {13, 1}}));
}

TEST(ScaleSample, EveryItemUpToEightRanksThenKeepOfThemMovingWithPAndSalt) {
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6};
  using test_support::sample_at_scale;
  EXPECT_EQ(sample_at_scale<int>(all, 8, 2), all);
  EXPECT_EQ(sample_at_scale<int>(all, 12, 2), (std::vector{5, 6}));
  EXPECT_EQ(sample_at_scale<int>(all, 16, 2), (std::vector{2, 3}));
  EXPECT_EQ(sample_at_scale<int>(all, 13, 2), (std::vector{6, 0}));  // wraps
  EXPECT_EQ(sample_at_scale<int>(all, 12, 1, 3), (std::vector{1}));
  EXPECT_EQ(sample_at_scale<int>(all, 32, 7), all);
  std::vector<bool> met(all.size());  // salts 0..6 at one count meet every item
  for (std::size_t salt = 0; salt < all.size(); ++salt) {
    for (int v : sample_at_scale<int>(all, 32, 1, salt)) met[static_cast<std::size_t>(v)] = true;
  }
  EXPECT_EQ(std::ranges::count(met, true), 7);
}

TEST_F(MeshTest, MeshIsOneByWorldSize) {
  EXPECT_EQ(mesh().rows(), 1);
  EXPECT_EQ(mesh().cols(), world_size());
  EXPECT_EQ(mesh().device_id(), world_rank());
}

class EveryMesh : public MeshShapeTest {};

TEST_P(EveryMesh, AllReduceOnARowSumsItsColumns) {
  EXPECT_EQ(mesh().rows() * mesh().cols(), world_size());
  const Tensor one = Tensor::from_vector<float>(Shape({1}), {1.0f});
  EXPECT_EQ(all_reduce(mesh(), one, {.axis = 1}).data<float>()[0],
            static_cast<float>(mesh().cols()));
}

MESHTEST_INSTANTIATE_MESH_SHAPES(EveryMesh);

// ------------------------------------------------------------ expect_matches_single_device

Tensor iota(const Shape& shape) {
  std::vector<float> v(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = 0.5f * static_cast<float>(i) - 3.0f;
  }
  return Tensor::from_vector(shape, v);
}

Tensor times_two(const Tensor& x) {
  Tensor y = x;
  for (float& e : y.span<float>()) {
    e *= 2;
  }
  return y;
}

TEST_F(MeshTest, ShardedOpMatchesItsReference) {
  // Rows split unevenly (11 over N devices), element-wise op, output sharded like the input.
  const auto c = expect_matches_single_device(
      mesh(), {{.full = iota(Shape({11, 3})), .placements = placements_1d(Shard{0})}},
      [](const std::vector<Tensor>& full) { return times_two(full[0]); },
      [](const MeshDevice&, const std::vector<Tensor>& local) { return times_two(local[0]); },
      placements_1d(Shard{0}), {.metric = Metric::max_abs, .threshold = 0, .label = "x2"});
  EXPECT_TRUE(c.passed);
  EXPECT_EQ(c.value, 0);
}

TEST_F(MeshTest, ShardedOpMismatchIsReportedOnceWithItsOwningDevice) {
  // [2p, 2] rows split over p devices: every device holds two rows, the last one included.
  const int last = mesh().size() - 1;
  const std::int64_t rows = 2 * static_cast<std::int64_t>(mesh().size());
  ::testing::TestPartResultArray failures;
  Comparison c;
  {
    ::testing::ScopedFakeTestPartResultReporter fake(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    c = expect_matches_single_device(
        mesh(), {{.full = iota(Shape({rows, 2})), .placements = placements_1d(Shard{0})}},
        [](const std::vector<Tensor>& full) { return times_two(full[0]); },
        [last](const MeshDevice& m, const std::vector<Tensor>& local) {
          Tensor y = times_two(local[0]);
          if (m.device_id() == last) {
            y.span<float>().back() += 1;  // a wrong last element
          }
          return y;
        },
        placements_1d(Shard{0}), {.metric = Metric::pcc, .threshold = 0.99999, .label = "bad"});
  }
  EXPECT_FALSE(c.passed);
  ASSERT_EQ(failures.size(), world_rank() == 0 ? 1 : 0);
  if (world_rank() == 0) {
    const std::string m = failures.GetTestPartResult(0).message();
    HAS_TEXT(m, "(bad)");
    HAS_TEXT(m, fmt::format("mesh 1x{}", mesh().size()));
    HAS_TEXT(m, fmt::format("input 0: [{}, 2] [Replicate, Shard(0)]", rows));
    HAS_TEXT(m, fmt::format("worst element index {} at [{}, 1] on device {}", 2 * rows - 1,
                            rows - 1, last));
  }
}

}  // namespace
}  // namespace meshtest::dist::testing
