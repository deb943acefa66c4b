// fault_jobs: for the launchers of the fault cases (test_faults, test_gpu_faults) — running a
// case's child job and reading back how it ended and what its ranks wrote (fault_step.hpp).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mpi_tests/harness_cases/spawn.hpp"

namespace meshtest::harness_cases {

/// Milliseconds since the epoch (the same clock in every process of the job).
inline long long now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// The whole file, or "" when it cannot be read.
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// How often `needle` occurs in `text`.
inline int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

/// How a case's job ended, and what its ranks wrote.
struct FaultJob {
  ChildResult result;           ///< exit code, seconds, the job's stdout and stderr
  std::string logs;             ///< every rank's log (reports/logs/rank<r>.log), in rank order
  long long ended_ms = 0;       ///< when the job ended (now_ms)
  int reached = 0;              ///< print_reach lines (fault_step.hpp) in the output and logs
  long long last_reach_ms = 0;  ///< the latest of them
};

/// Runs `binary --gtest_filter=<filter> --gtest_color=no` as an mpirun job of `ranks` ranks
/// (--oversubscribe), its reports under dir/reports, with the harness's deadline
/// MESHTEST_TEST_TIMEOUT = `deadline` s and child_environment(env); the job is killed after
/// deadline + 60 s. Its output is kept in dir/output.txt.
inline FaultJob run_fault_job(const std::string& binary, int ranks, const std::string& filter,
                              const std::filesystem::path& dir, int deadline,
                              std::vector<std::string> env) {
  const std::vector<std::string> argv = {mpiexec(),         "-np",  std::to_string(ranks),
                                         "--oversubscribe", binary, "--gtest_filter=" + filter,
                                         "--gtest_color=no"};
  env.push_back("MESHTEST_REPORTS_DIR=" + (dir / "reports").string());
  env.push_back("MESHTEST_TEST_TIMEOUT=" + std::to_string(deadline));
  FaultJob job;
  job.result = run_child(argv, child_environment(env), std::chrono::seconds(deadline + 60),
                         (dir / "output.txt").string());
  job.ended_ms = now_ms();
  for (int rank = 0; rank < ranks; ++rank) {
    job.logs += slurp(dir / "reports" / "logs" / ("rank" + std::to_string(rank) + ".log"));
  }
  const std::string all = job.result.output + job.logs;
  const std::regex reach(R"(\[fault\] rank [0-9]+ reaches the collective at ([0-9]+))");
  for (auto it = std::sregex_iterator(all.begin(), all.end(), reach); it != std::sregex_iterator();
       ++it) {
    job.last_reach_ms = std::max(job.last_reach_ms, std::stoll((*it)[1]));
    ++job.reached;
  }
  return job;
}

/// The processes whose environment holds `marker` ("NAME=value").
inline std::vector<pid_t> processes_with(const std::string& marker) {
  namespace fs = std::filesystem;
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "environ", std::ios::binary);
    for (std::string entry; std::getline(in, entry, '\0');) {
      if (entry == marker) {
        out.push_back(static_cast<pid_t>(std::stol(name)));
        break;
      }
    }
  }
  return out;
}

/// The processes with `marker` still running 5 s after the job ended (polled every 100 ms), each
/// killed with SIGKILL: a job must leave none behind.
inline std::vector<pid_t> kill_leftovers(const std::string& marker) {
  std::vector<pid_t> left = processes_with(marker);
  for (int i = 0; i < 50 && !left.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    left = processes_with(marker);
  }
  for (pid_t p : left) ::kill(p, SIGKILL);
  return left;
}

}  // namespace meshtest::harness_cases
