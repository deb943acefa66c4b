// meshtest-run dpsgd end to end: files in, files out, against the one-sample-at-a-time
// reference; single device vs mpirun -np 2 and 3; bad input exits 2.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "src/core/npy.hpp"
#include "src/core/random.hpp"
#include "src/core/safetensors.hpp"
#include "src/dp/noise.hpp"
#include "tests/support/dp_reference.hpp"

namespace meshtest::dp {
namespace {

namespace fs = std::filesystem;
using test_support::rel_err;

fs::path run_binary() {
  return fs::canonical("/proc/self/exe").parent_path().parent_path() / "bin" / "meshtest-run";
}

// Exit code of a shell command (stdout and stderr to `log`).
int sh(const std::string& cmd, const fs::path& log) {
  const int st = std::system((cmd + " > " + log.string() + " 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

class RunDpsgd : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(run_binary())) << run_binary() << " missing: build meshtest-run first";
    dir_ = fs::temp_directory_path() / fmt::format("meshtest_dpsgd_cli_{}", getpid());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

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

  std::string log(const std::string& tag) {
    std::ifstream in(dir_ / (tag + ".log"));
    return {std::istreambuf_iterator<char>(in), {}};
  }

  fs::path dir_;
  Tensor x_, y_;
};

TEST_F(RunDpsgd, SingleAndShardedMatchTheReference) {
  const std::string spec = "linear:6,gelu,rmsnorm,linear:4";
  const Sequential m = write_inputs(spec, {5, 3, 7}, LossKind::ce, DType::f64);
  const DpOptions opt{.clip = 0.3, .loss = LossKind::ce, .reduction = Reduction::mean};
  const auto ref = test_support::dp_reference(m, x_, y_, opt);
  const std::string extra =
      "--loss ce --reduction mean --mode fused_bk --clip 0.3 --noise 0.5 --seed 9";
  ASSERT_EQ(sh(args(spec, extra, "np1"), dir_ / "np1.log"), 0) << log("np1");
  for (const int np : {2, 3}) {
    const std::string tag = fmt::format("np{}", np);
    ASSERT_EQ(sh(fmt::format("mpirun --oversubscribe --allow-run-as-root -np {} {}", np,
                             args(spec, extra, tag)),
                 dir_ / (tag + ".log")),
              0)
        << log(tag);
  }
  const auto params = m.parameters();
  for (const std::string tag : {"np1", "np2", "np3"}) {
    const Tensor norms = read_npy(dir_ / (tag + "_n.npy"));
    EXPECT_LE(rel_err(norms, test_support::as_tensor(ref.norms)), 1e-10) << tag;
    const SafetensorsFile g = SafetensorsFile::open(dir_ / (tag + "_g.safetensors"));
    ASSERT_EQ(g.names().size(), params.size()) << tag;
    for (std::size_t p = 0; p < params.size(); ++p) {
      Tensor want = ref.clipped[p];
      add_noise(want, 0, static_cast<std::int64_t>(p), 0, {.sigma = 0.5, .seed = 9}, 0.3, 5.0);
      EXPECT_LE(rel_err(g.read(params[p]->name), want), 1e-10) << tag << " " << params[p]->name;
    }
  }
}

TEST_F(RunDpsgd, TwoDimensionalMseSumF32) {
  const std::string spec = "linear:5,relu,linear:3";
  const Sequential m = write_inputs(spec, {4, 6}, LossKind::mse, DType::f32);
  const auto ref =
      test_support::dp_reference(m, x_, y_, {.clip = 1.0, .reduction = Reduction::sum});
  ASSERT_EQ(sh(args(spec, "--loss mse --reduction sum --mode ghost --clip 1", "a"), dir_ / "a.log"),
            0)
      << log("a");
  EXPECT_LE(rel_err(read_npy(dir_ / "a_n.npy"), test_support::as_tensor(ref.norms)), 1e-5);
  const SafetensorsFile g = SafetensorsFile::open(dir_ / "a_g.safetensors");
  EXPECT_EQ(g.info("0.weight").dtype, DType::f32);
  EXPECT_LE(rel_err(g.read("2.weight"), ref.clipped[2]), 1e-5);
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
  for (const auto& [extra, want] : bad) {
    EXPECT_EQ(sh(args(spec, extra, "bad"), dir_ / "bad.log"), 2) << extra;
    EXPECT_NE(log("bad").find(want), std::string::npos) << extra << ": " << log("bad");
  }
  EXPECT_EQ(sh(args("linear:5,relu,linear:4", "--clip 1", "bad"), dir_ / "bad.log"), 2);
  EXPECT_NE(log("bad").find("2.weight"), std::string::npos) << log("bad");
  EXPECT_EQ(sh(args("linear:5,relu", "--clip 1", "bad"), dir_ / "bad.log"), 2);
  EXPECT_NE(log("bad").find("not a parameter"), std::string::npos) << log("bad");
  // Sharded: every rank rejects the same input and exits 2.
  EXPECT_EQ(sh("mpirun --oversubscribe --allow-run-as-root -np 2 " + args(spec, "--clip 0", "bad"),
               dir_ / "bad.log"),
            2);
  EXPECT_NE(log("bad").find("C > 0"), std::string::npos) << log("bad");
  write_npy(dir_ / "x.npy", Tensor({4, 0, 6}, DType::f64));  // T = 0
  EXPECT_EQ(sh(args(spec, "--clip 1", "bad"), dir_ / "bad.log"), 2);
  EXPECT_NE(log("bad").find("T = 0"), std::string::npos) << log("bad");
}

TEST_F(RunDpsgd, EmptyBatchStillAddsNoise) {
  const std::string spec = "linear:3";
  write_inputs(spec, {0, 4}, LossKind::mse, DType::f64);
  ASSERT_EQ(sh(args(spec, "--clip 1 --noise 1 --seed 2", "e"), dir_ / "e.log"), 0) << log("e");
  EXPECT_EQ(read_npy(dir_ / "e_n.npy").shape(), Shape{0});
  const Tensor g = SafetensorsFile::open(dir_ / "e_g.safetensors").read("0.weight");
  EXPECT_EQ(g.item(1), normal_at({.seed = 2, .stream = 0}, 1));  // σ C z / max(B, 1)
}

}  // namespace
}  // namespace meshtest::dp
