// The tests' temporary directories: one level per test, removed, and killed runs swept.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "tests/support/temp_dir.hpp"

namespace meshtest::test_support {
namespace test_temp_dir {

namespace fs = std::filesystem;

/// The pid of a process that has ended (a child reaped at once).
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

class Param : public ::testing::TestWithParam<int> {};

TEST_P(Param, ADirectoryPerTestIsOneLevelAndIsRemoved) {
  fs::path kept;
  {
    const TempDir dir("unit");
    kept = dir.path();
    EXPECT_EQ(dir.path().parent_path(), run_temp_dir());
    EXPECT_TRUE(fs::is_directory(dir.path()));
    EXPECT_EQ(dir.path().filename().string().find('/'), std::string::npos);
    EXPECT_NE(dir.path().filename().string().find("Param.ADirectoryPerTestIsOneLevel"),
              std::string::npos)
        << dir.path();
  }
  EXPECT_FALSE(fs::exists(kept));
  // Nothing else of this test is left in the run's directory.
  EXPECT_EQ(fs::directory_iterator(run_temp_dir()), fs::directory_iterator());
}
INSTANTIATE_TEST_SUITE_P(TempDir, Param, ::testing::Values(0, 1));

TEST(TempDir, RemovesOnlyTheDeadRunsOfThisHost) {
  const TempDir root("sweep");
  const auto make = [&](const std::string& name) {
    fs::create_directories(root.path() / name / "inside");
    return root.path() / name;
  };
  const fs::path dead = make(run_prefix() + std::to_string(dead_pid()));
  const fs::path alive = make(run_prefix() + std::to_string(::getpid()));
  const fs::path other_host = make("meshtest-run-elsewhere.invalid-" + std::to_string(dead_pid()));
  const fs::path not_a_pid = make(run_prefix() + "12x");
  const fs::path unrelated = make("meshtest_tp_ckpt_1");
  remove_dead_runs(root.path());
  EXPECT_FALSE(fs::exists(dead));
  for (const fs::path& p : {alive, other_host, not_a_pid, unrelated}) {
    EXPECT_TRUE(fs::exists(p / "inside")) << p;
  }
}

TEST(TempDir, TheRootFollowsMeshtestTmpdir) {
  const char* v = std::getenv("MESHTEST_TMPDIR");
  if (v != nullptr && *v != '\0') {
    EXPECT_EQ(run_temp_dir().parent_path(), fs::path(v));
  } else {
    EXPECT_EQ(run_temp_dir().parent_path(), fs::temp_directory_path());
  }
}

}  // namespace test_temp_dir
}  // namespace meshtest::test_support
