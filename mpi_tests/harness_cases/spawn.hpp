// run_child: runs a command (a child mpirun job) with a hard timeout, for the harness's tests.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

extern char** environ;

namespace meshtest::harness_cases {

/// A child program: $`env` when set, else `built` (the path CMake compiled in, may be null),
/// else harness_cases/`name` next to this binary.
inline std::string case_program(const char* env, const char* built, const std::string& name) {
  if (const char* p = std::getenv(env); p != nullptr && *p != '\0') return p;
  if (built != nullptr) return built;
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "harness_cases" / name)
      .string();
}

/// The mpirun that CMake found (MESHTEST_MPIEXEC), else "mpirun" from PATH.
inline std::string mpiexec() {
#ifdef MESHTEST_MPIEXEC
  return MESHTEST_MPIEXEC;
#else
  return "mpirun";
#endif
}

/// How a child ended and what it printed.
struct ChildResult {
  int exit_code = -1;      ///< exit status, when it exited
  int signal = 0;          ///< terminating signal, when it was killed
  bool timed_out = false;  ///< killed by run_child after the timeout
  double seconds = 0;      ///< wall time
  std::string output;      ///< stdout and stderr, interleaved
};

/// The environment for a child mpirun launched from an MPI rank. Preferably the environment
/// of the mpirun that launched this rank (the user's, with their OMPI_MCA_* settings, before
/// mpirun added its per-rank variables), read from /proc/<ppid>/environ; else this process's
/// environment without the launcher's variables (OMPI_*, PMIX_*, OPAL_*, ORTE_*, PRTE_*; but
/// the user's settings are kept: OMPI_ALLOW_RUN_AS_ROOT*, and the MCA parameters of the
/// frameworks a user or a machine image sets, OMPI_MCA_{mca_base,plm,rmaps,btl,pml,hwloc}[_=]*,
/// as an image without ssh sets OMPI_MCA_plm=isolated, and PMIX_MCA_*). Either way without
/// MESHTEST_* and GTEST_* settings, plus `extra` ("NAME=value").
inline std::vector<std::string> child_environment(const std::vector<std::string>& extra) {
  std::vector<std::string> base;
  bool from_launcher = false;
  const std::string parent = "/proc/" + std::to_string(getppid());
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink(parent + "/exe", ec).filename().string();
  if (!ec && (exe == "orterun" || exe == "mpirun" || exe == "mpiexec" || exe == "prterun")) {
    std::ifstream in(parent + "/environ", std::ios::binary);
    for (std::string entry; std::getline(in, entry, '\0');) {
      if (!entry.empty()) base.push_back(entry);
    }
    from_launcher = !base.empty();
  }
  if (!from_launcher) {
    for (char** e = environ; *e != nullptr; ++e) base.emplace_back(*e);
  }
  std::vector<std::string> env;
  for (const std::string& entry : base) {
    const std::string_view v(entry);
    const bool launcher = v.starts_with("OMPI_") || v.starts_with("PMIX_") ||
                          v.starts_with("OPAL_") || v.starts_with("ORTE_") ||
                          v.starts_with("PRTE_");
    bool user_setting = v.starts_with("OMPI_ALLOW_RUN_AS_ROOT") || v.starts_with("PMIX_MCA_");
    for (std::string_view framework : {"mca_base", "plm", "rmaps", "btl", "pml", "hwloc"}) {
      const std::string_view rest = v.starts_with("OMPI_MCA_") ? v.substr(9) : std::string_view();
      user_setting =
          user_setting || (rest.starts_with(framework) && rest.size() > framework.size() &&
                           (rest[framework.size()] == '_' || rest[framework.size()] == '='));
    }
    const bool ours = v.starts_with("MESHTEST_") || v.starts_with("GTEST_");
    if (ours || (!from_launcher && launcher && !user_setting)) continue;
    env.push_back(entry);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

/// Every descendant of `root` (from /proc), children before grandchildren.
inline std::vector<pid_t> descendants(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> parent_of;  // (pid, ppid)
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');  // the command name may hold spaces
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    parent_of.emplace_back(static_cast<pid_t>(std::stol(name)), ppid);
  }
  std::vector<pid_t> out = {root};
  for (std::size_t i = 0; i < out.size(); ++i) {
    for (const auto& [pid, ppid] : parent_of) {
      if (ppid == out[i]) out.push_back(pid);
    }
  }
  out.erase(out.begin());
  return out;
}

/// Runs argv (argv[0] looked up in PATH) in its own process group with stdout and stderr sent
/// to `output_path` and stdin from /dev/null. After `timeout` the child's group gets SIGTERM,
/// then 3 s later the group and every descendant (mpirun puts its ranks in their own process
/// groups) get SIGKILL. Never blocks longer than timeout + 3 s.
inline ChildResult run_child(const std::vector<std::string>& argv,
                             const std::vector<std::string>& env, std::chrono::seconds timeout,
                             const std::string& output_path) {
  using Clock = std::chrono::steady_clock;
  std::vector<char*> cargv, cenv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  for (const std::string& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cargv.push_back(nullptr);
  cenv.push_back(nullptr);

  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, output_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&files, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  ChildResult result;
  const auto start = Clock::now();
  pid_t pid = -1;
  // The child may use every CPU, not only the one mpirun bound this rank to (np <= 2 binds to
  // cores): it inherits this thread's affinity, widened for the spawn and restored after.
  cpu_set_t own, every;
  const bool widened = sched_getaffinity(0, sizeof own, &own) == 0;
  if (widened) {
    CPU_ZERO(&every);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) CPU_SET(cpu, &every);
    sched_setaffinity(0, sizeof every, &every);
  }
  const int rc = posix_spawnp(&pid, cargv[0], &files, &attr, cargv.data(), cenv.data());
  if (widened) sched_setaffinity(0, sizeof own, &own);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    result.output = "posix_spawnp failed for " + argv[0];
    return result;
  }
  int status = 0;
  std::vector<pid_t> tree;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    const auto elapsed = Clock::now() - start;
    if (!result.timed_out && elapsed > timeout) {
      result.timed_out = true;
      tree = descendants(pid);
      kill(-pid, SIGTERM);
    } else if (result.timed_out && elapsed > timeout + std::chrono::seconds(3)) {
      kill(-pid, SIGKILL);
      for (pid_t p : tree) kill(p, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-pid, SIGKILL);  // anything left in the group
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  std::ifstream in(output_path);
  std::stringstream text;
  text << in.rdbuf();
  result.output = text.str();
  return result;
}

}  // namespace meshtest::harness_cases
