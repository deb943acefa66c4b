// Test helper: a fresh temporary directory per test, under one directory per run, all removed.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace meshtest::test_support {

/// Where the runs' directories live: $MESHTEST_TMPDIR (launch/meshtest test points it at a
/// fresh folder and fails when anything is left in it), else the system temp dir.
inline std::filesystem::path temp_root() {
  const char* v = std::getenv("MESHTEST_TMPDIR");
  if (v != nullptr && *v != '\0') return v;
  return std::filesystem::temp_directory_path();
}

/// This host's name as it appears in run directory names.
inline std::string temp_host() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

inline std::string run_prefix() { return "meshtest-run-" + temp_host() + "-"; }

/// Removes the run directories in `root` of this host's processes that no longer exist
/// (killed runs, which could not remove their own).
inline void remove_dead_runs(const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  const std::string prefix = run_prefix();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + prefix.size(), &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove_all(e, ec);
  }
}

/// The directory of this process's run, meshtest-run-<host>-<pid> under temp_root(): made on
/// first use (which also runs remove_dead_runs), removed with everything in it when the
/// process exits normally.
inline const std::filesystem::path& run_temp_dir() {
  struct Run {
    std::filesystem::path path = temp_root() / (run_prefix() + std::to_string(::getpid()));
    Run() {
      remove_dead_runs(temp_root());
      std::filesystem::create_directories(path);
    }
    ~Run() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Run run;
  return run.path;
}

/// A directory named after the running test (its '/' replaced, so a parameterized test's
/// directory is one level), created empty in run_temp_dir() and removed with its contents on
/// destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "meshtest") : path_(run_temp_dir() / leaf(prefix)) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  static std::string leaf(const std::string& prefix) {
    std::string name = prefix;
    if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info()) {
      name += std::string("_") + info->test_suite_name() + "." + info->name();
    }
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    return name;
  }

  std::filesystem::path path_;
};

}  // namespace meshtest::test_support
