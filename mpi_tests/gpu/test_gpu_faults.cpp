// GPU ranks: a rank's fault ends the job promptly and names the rank and the collective the
// others wait in. Each case of gpu_fault_case.cpp runs as a child job (mpirun -np N, N from
// --np, a 20 s deadline) in which rank 1 throws, fails an ASSERT, exits, is killed, or faults in
// a kernel (illegal address, trap) while the others wait inside an exact all_reduce or
// reduce_scatter on device buffers; this test checks how the job ended: a non-zero exit within
// the deadline + 10 s, one report naming rank 1, the test and the collective, every rank's
// job-end hooks run once where the harness ended the job (the NCCL communicators aborted: the
// ranks that polled left their collective with an error), and no process of the job left
// behind. At the end it prints the fault table (case, exit code, seconds, the message's first
// line). One process, no MPI of its own; exits 77 (skipped) with the reason where this machine
// has fewer GPUs than the job's ranks.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "mpi_tests/harness_cases/fault_jobs.hpp"
#include "tests/gpu/skip.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest::harness_cases {
namespace {

constexpr int kDeadline = 20;  // seconds, MESHTEST_TEST_TIMEOUT of the child job
constexpr int kFaulty = 1;

int g_ranks = 0;  // --np

std::string case_binary() {
#ifdef MESHTEST_GPU_FAULT_CASE
  const char* built = MESHTEST_GPU_FAULT_CASE;
#else
  const char* built = nullptr;
#endif
  return case_program("MESHTEST_GPU_FAULT_CASE", built, "gpu_fault_case");
}

enum class Ender {
  harness,         ///< the coordinator ends the job; the other ranks poll, so the abort frees
                   ///< them and each says how it left its collective
  harness_blocks,  ///< the same, but the other ranks are blocked in the CUDA runtime
  mpirun,          ///< rank 1 dies by a signal: mpirun ends the job
};

struct Case {
  const char* name;  ///< GpuFault.<name> in gpu_fault_case.cpp
  Ender ender;
  std::vector<const char*> says;  ///< what the job's output must hold, beyond rank 1 and the test
  const char* error = nullptr;    ///< a regex rank 1's error must match, if any
};

std::ostream& operator<<(std::ostream& o, const Case& c) { return o << c.name; }

/// A kernel fault surfaces as the CUDA error, or as NCCL's "unhandled cuda error" when NCCL's
/// own polling of the stream sees it first.
constexpr const char* kKernelFault =
    "(CUDA error cudaError[A-Za-z]+|NCCL error unhandled cuda error)";

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"Throw", Ender::harness, {"rank 1 throws", "all_reduce #3 f32[65536]"}},
      {"Assert", Ender::harness, {"rank 1 fails an ASSERT", "reduce_scatter #3 f32[65536]"}},
      {"Exit", Ender::harness, {"rank 1 exited with status 3", "all_reduce #3 f32[65536]"}},
      {"SigKill", Ender::mpirun, {"signal 9"}},
      {"IllegalAddress",
       Ender::harness,
       {"rank 1's kernel that writes through a null pointer", "all_reduce #3 f32[65536]"},
       "(CUDA error cudaErrorIllegalAddress|NCCL error unhandled cuda error)"},
      {"LaunchFailure",
       Ender::harness,
       {"rank 1's kernel that traps", "reduce_scatter #3 f32[65536]"},
       kKernelFault},
      {"OthersBlockInCuda",
       Ender::harness_blocks,
       {"rank 1 throws while the others block in CUDA calls", "all_reduce #3 f32[65536]"}},
  };
  return all;
}

/// One line of the fault table.
struct Row {
  std::string name;
  int exit_code = -1;
  double seconds = 0;
  int released = 0;  ///< ranks other than 1 that left their collective with an error
  std::string message;
};

std::vector<Row>& table() {
  static std::vector<Row> rows;
  return rows;
}

/// The report's first line ("[meshtest] ==== ending the job: ... ===="), else the first line
/// naming rank 1 that the job's ranks did not print themselves (mpirun's notice), else "".
std::string first_line(const std::string& out) {
  std::string fallback;
  std::string_view rest(out);
  while (!rest.empty()) {
    const std::size_t end = std::min(rest.find('\n'), rest.size());
    const std::string_view line = rest.substr(0, end);
    rest.remove_prefix(std::min(end + 1, rest.size()));
    if (line.find("==== ending the job") != std::string_view::npos) return std::string(line);
    if (fallback.empty() && line.find("rank 1") != std::string_view::npos &&
        !line.starts_with("[fault]")) {
      fallback = line;
    }
  }
  return fallback;
}

class GpuFaults : public ::testing::TestWithParam<Case> {};

TEST_P(GpuFaults, EndPromptlyNamingRankAndCollective) {
  const Case& c = GetParam();
  ASSERT_TRUE(std::filesystem::exists(case_binary())) << case_binary() << " is not built";
  const test_support::TempDir dir(fmt::format("gpu_fault_{}_np{}", c.name, g_ranks));
  const std::string marker = fmt::format("MESHTEST_GPU_FAULT_JOB={}-{}", ::getpid(), c.name);
  const FaultJob job = run_fault_job(
      case_binary(), g_ranks, std::string("GpuFault.") + c.name, dir.path(), kDeadline,
      {marker, "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"});
  const ChildResult& r = job.result;
  const std::string& out = r.output;
  const std::string all = out + job.logs;
  SCOPED_TRACE("the job's output:\n" + out + "\nthe ranks' logs:\n" + job.logs);

  int released = 0;
  for (int rank = 0; rank < g_ranks; ++rank) {
    if (rank != kFaulty &&
        all.find(fmt::format("[fault] rank {} left the collective: ", rank)) != std::string::npos) {
      ++released;
    }
  }
  table().push_back({.name = c.name,
                     .exit_code = r.exit_code,
                     .seconds = r.seconds,
                     .released = released,
                     .message = first_line(out)});

  EXPECT_FALSE(r.timed_out) << "the job hung";
  EXPECT_NE(r.exit_code, 0) << "the job exited 0";
  EXPECT_LE(r.seconds, kDeadline + 10) << "the job took " << r.seconds << " s";
  EXPECT_EQ(job.reached, g_ranks) << "not every rank reached the faulty step";
  // One message, naming rank 1, the test and (where the harness ends the job) the collective.
  EXPECT_NE(out.find(std::string("GpuFault.") + c.name), std::string::npos);
  EXPECT_NE(out.find("rank 1"), std::string::npos);
  if (c.ender == Ender::mpirun) {
    EXPECT_LE(count(out, "==== ending the job"), 1);
  } else {
    EXPECT_EQ(count(out, "==== ending the job"), 1);
  }
  for (const char* s : c.says) EXPECT_NE(all.find(s), std::string::npos) << "no '" << s << "'";
  if (c.error != nullptr) {
    EXPECT_TRUE(std::regex_search(out, std::regex(c.error))) << "no error matching " << c.error;
  }

  // Where the harness ended the job, every rank ran its job-end hooks (dist/gpu's abort among
  // them) once.
  for (int rank = 0; rank < g_ranks && c.ender != Ender::mpirun; ++rank) {
    EXPECT_EQ(count(all, fmt::format("[fault] rank {} ran its job-end hooks", rank)), 1)
        << "rank " << rank;
  }
  // How many waiting ranks logged their release before MPI_Abort ended them is a race (at np 4
  // on H100s 1 to 3 of 3): the table reports it; that the job ended, promptly, naming rank 1
  // and the collective, is what is required.

  const std::vector<pid_t> left = kill_leftovers(marker);
  EXPECT_TRUE(left.empty()) << left.size() << " processes of the job are still running";
}

INSTANTIATE_TEST_SUITE_P(Rank1, GpuFaults, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

/// The fault table, as Markdown.
void print_table() {
  std::printf(
      "\nGPU fault table, np %d (deadline %d s; released: the other ranks that left "
      "their collective with an error, of %d):\n\n",
      g_ranks, kDeadline, g_ranks - 1);
  std::printf("| case | exit code | seconds | released | message (first line) |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");
  for (const Row& row : table()) {
    std::printf("| %s | %d | %.1f | %d | %s |\n", row.name.c_str(), row.exit_code, row.seconds,
                row.released, row.message.c_str());
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace meshtest::harness_cases

int main(int argc, char** argv) {
  using namespace meshtest;
  ::testing::InitGoogleTest(&argc, argv);
  int& ranks = harness_cases::g_ranks;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string_view(argv[i]) == "--np") ranks = std::atoi(argv[i + 1]);
  }
  if (ranks < 2) {
    std::fprintf(stderr, "usage: %s --np N [gtest flags] (N >= 2: the ranks of each fault job)\n",
                 argv[0]);
    return 2;
  }
  const std::string why = gpu::testing::skip_reason(ranks);
  if (!why.empty()) {
    std::printf("[  SKIPPED ] GPU ranks unavailable (fault jobs of %d ranks): %s\n", ranks,
                why.c_str());
    return gpu::testing::kSkipExitCode;
  }
  const int rc = RUN_ALL_TESTS();
  harness_cases::print_table();
  return rc;
}
