// meshtest-run dpsgd end to end: files in, files out, against the one-sample-at-a-time
// reference; single device vs mpirun -np 2 and 3; bad input exits 2.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "src/check/tolerance.hpp"
#include "src/core/npy.hpp"
#include "src/core/random.hpp"
#include "src/core/safetensors.hpp"
#include "src/dp/noise.hpp"
#include "tests/support/dp_reference.hpp"
#include "tests/support/run_command.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest::dp {
namespace {

namespace fs = std::filesystem;
using test_support::run_command;

// Expects `got` within the error model of `want` (src/check/tolerance.hpp): the same
// computation in `dt` in another order, `terms` per element, the terms' magnitude `scale`.
void expect_model(const Tensor& want, const Tensor& got, DType dt, std::int64_t terms, double scale,
                  const std::string& label) {
  const Comparison r = compare(want, got, ErrorModel{.dtype = dt, .terms = terms}, scale);
  EXPECT_TRUE(r.passed) << label << ": " << r;
}

fs::path run_binary() {
  return fs::canonical("/proc/self/exe").parent_path().parent_path() / "bin" / "meshtest-run";
}

class RunDpsgd : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(run_binary())) << run_binary() << " missing: build meshtest-run first";
  }

  // Writes model weights (PyTorch names), inputs and targets; returns the model.
  Sequential write_inputs(const std::string& spec, const Shape& xs, LossKind loss, DType dt) {
    Sequential m = parse_model(spec, xs[xs.rank() - 1], dt, {.seed = 4});
    std::vector<std::pair<std::string, Tensor>> w;
    for (const Param* p : m.parameters()) w.emplace_back(p->name, p->value);
    write_safetensors(dir_ / "w.safetensors", w);
    x_ = random_normal(xs, dt, {.seed = 5});
    const std::int64_t out = m.out_features(xs[xs.rank() - 1]);
    y_ = loss == LossKind::mse
             ? random_normal(xs.with(xs.rank() - 1, out), dt, {.seed = 6})
             : random_integers(xs.rank() == 2 ? Shape{xs[0]} : Shape{xs[0], xs[1]}, DType::i64,
                               {.seed = 6}, 0, out - 1);
    write_npy(dir_ / "x.npy", x_);
    write_npy(dir_ / "y.npy", y_);
    return m;
  }

  std::string args(const std::string& spec, const std::string& extra, const std::string& tag) {
    return fmt::format(
        "{} dpsgd --model {} --weights {} --inputs {} --targets {} --out-norms {} --out-grads {} "
        "{}",
        run_binary().string(), spec, (dir_ / "w.safetensors").string(), (dir_ / "x.npy").string(),
        (dir_ / "y.npy").string(), (dir_ / (tag + "_n.npy")).string(),
        (dir_ / (tag + "_g.safetensors")).string(), extra);
  }

  test_support::TempDir tmp_{"dpsgd_cli"};
  fs::path dir_ = tmp_.path();
  Tensor x_, y_;
};

TEST_F(RunDpsgd, SingleAndShardedMatchTheReference) {
  const std::string spec = "linear:6,gelu,rmsnorm,linear:4";
  const Sequential m = write_inputs(spec, {5, 3, 7}, LossKind::ce, DType::f64);
  const DpOptions opt{.clip = 0.3, .loss = LossKind::ce, .reduction = Reduction::mean};
  const auto ref = test_support::dp_reference(m, x_, y_, opt);
  const std::string extra =
      "--loss ce --reduction mean --mode fused_bk --clip 0.3 --noise 0.5 --seed 9";
  const auto np1 = run_command(args(spec, extra, "np1"));
  ASSERT_EQ(np1.status, 0) << np1.out;
  for (const int np : {2, 3}) {
    const auto r = run_command(fmt::format("mpirun --oversubscribe --allow-run-as-root -np {} {}",
                                           np, args(spec, extra, fmt::format("np{}", np))));
    ASSERT_EQ(r.status, 0) << r.out;
  }
  const auto params = m.parameters();
  // The model's chains (test_support::dp_terms); FSDP's sum of the np devices' partial clipped
  // sums adds np terms. The clipped sum's terms have magnitude max |clipped|: the noise is the
  // same on both sides but for the rounding of its sum.
  const test_support::DpTerms n = test_support::dp_terms(m, x_);
  const Tensor want_norms = test_support::as_tensor(ref.norms);
  for (const int np : {1, 2, 3}) {
    const std::string tag = fmt::format("np{}", np);
    expect_model(want_norms, read_npy(dir_ / (tag + "_n.npy")), DType::f64, n.norm,
                 test_support::max_abs(want_norms), tag + " norms");
    const SafetensorsFile g = SafetensorsFile::open(dir_ / (tag + "_g.safetensors"));
    ASSERT_EQ(g.names().size(), params.size()) << tag;
    for (std::size_t p = 0; p < params.size(); ++p) {
      Tensor want = ref.clipped[p];
      add_noise(want, 0, static_cast<std::int64_t>(p), 0, {.sigma = 0.5, .seed = 9}, 0.3, 5.0);
      expect_model(want, g.read(params[p]->name), DType::f64, n.clipped + np,
                   test_support::max_abs(ref.clipped[p]), tag + " " + params[p]->name);
    }
  }
}

TEST_F(RunDpsgd, TwoDimensionalMseSumF32) {
  const std::string spec = "linear:5,relu,linear:3";
  const Sequential m = write_inputs(spec, {4, 6}, LossKind::mse, DType::f32);
  const auto ref =
      test_support::dp_reference(m, x_, y_, {.clip = 1.0, .reduction = Reduction::sum});
  const auto r = run_command(args(spec, "--loss mse --reduction sum --mode ghost --clip 1", "a"));
  ASSERT_EQ(r.status, 0) << r.out;
  // The reference's per-sample gradients are the f32 model's: f32 in another order.
  const test_support::DpTerms n = test_support::dp_terms(m, x_);
  const Tensor want_norms = test_support::as_tensor(ref.norms);
  expect_model(want_norms, read_npy(dir_ / "a_n.npy"), DType::f32, n.norm,
               test_support::max_abs(want_norms), "norms");
  const SafetensorsFile g = SafetensorsFile::open(dir_ / "a_g.safetensors");
  EXPECT_EQ(g.info("0.weight").dtype, DType::f32);
  expect_model(ref.clipped[2], g.read("2.weight"), DType::f32, n.clipped,
               test_support::max_abs(ref.clipped[2]), "2.weight");
}

TEST_F(RunDpsgd, BadInputExitsTwo) {
  const std::string spec = "linear:5,relu,linear:3";
  write_inputs(spec, {4, 2, 6}, LossKind::mse, DType::f64);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--clip 0", "C > 0"},
      {"--clip -1", "C > 0"},
      {"--clip 1 --noise -0.5", "sigma >= 0"},
      {"--clip 1 --mode flash", "registered: fused, fused_bk, ghost, hooks, non_private"},
      {"--clip 1 --mode non_private", "no per-sample norms"},
      {"--clip 1 --loss l1", "unknown loss"},
      {"--clip 1 --loss ce", "ce targets"},
      {"--clip 1 --reduction avg", "unknown loss reduction"},
  };
  const auto expect_exit_2 = [](const std::string& cmd, const std::string& want) {
    const auto r = run_command(cmd);
    EXPECT_EQ(r.status, 2) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << cmd << ": " << r.out;
  };
  for (const auto& [extra, want] : bad) expect_exit_2(args(spec, extra, "bad"), want);
  expect_exit_2(args("linear:5,relu,linear:4", "--clip 1", "bad"), "2.weight");
  expect_exit_2(args("linear:5,relu", "--clip 1", "bad"), "not a parameter");
  // Sharded: every rank rejects the same input and exits 2.
  expect_exit_2("mpirun --oversubscribe --allow-run-as-root -np 2 " + args(spec, "--clip 0", "bad"),
                "C > 0");
  // Output paths are checked (by rank 0, the writer) before any work: a missing directory and
  // a directory in place of the file are bad input on every rank.
  expect_exit_2(args(spec, "--clip 1", "nodir/x"), "nodir does not exist");
  expect_exit_2(
      "mpirun --oversubscribe --allow-run-as-root -np 2 " + args(spec, "--clip 1", "nodir/x"),
      "nodir does not exist");
  fs::create_directory(dir_ / "isdir_n.npy");
  expect_exit_2(args(spec, "--clip 1", "isdir"), "isdir_n.npy: it is a directory");
  write_npy(dir_ / "x.npy", Tensor({4, 0, 6}, DType::f64));  // T = 0
  expect_exit_2(args(spec, "--clip 1", "bad"), "T = 0");
}

// A failure after the ranks started communicating is that rank's alone: it names the rank and
// aborts the job (exit 3) instead of leaving others waiting. Here rank 0 cannot create its
// output, whose name (300 characters) passes the directory check but exceeds NAME_MAX.
TEST_F(RunDpsgd, FailureWhileCommunicatingAbortsNamingTheRank) {
  const std::string spec = "linear:3";
  write_inputs(spec, {4, 5}, LossKind::mse, DType::f64);
  const std::string cmd = "mpirun --oversubscribe --allow-run-as-root -np 2 " +
                          args(spec, "--clip 1", std::string(300, 'n'));
  const auto r = run_command(cmd);
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_NE(r.out.find("meshtest-run dpsgd: [rank 0] error:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nnnnnnnn"), std::string::npos) << r.out;
}

TEST_F(RunDpsgd, EmptyBatchStillAddsNoise) {
  const std::string spec = "linear:3";
  write_inputs(spec, {0, 4}, LossKind::mse, DType::f64);
  const auto r = run_command(args(spec, "--clip 1 --noise 1 --seed 2", "e"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_npy(dir_ / "e_n.npy").shape(), Shape{0});
  const Tensor g = SafetensorsFile::open(dir_ / "e_g.safetensors").read("0.weight");
  EXPECT_EQ(g.item(1), normal_at({.seed = 2, .stream = 0}, 1));  // σ C z / max(B, 1)
}

}  // namespace
}  // namespace meshtest::dp
