// The tests' run_command helper: output and exit code of a shell command, quoting, and a hung
// command stopped at its time limit with exit 124 and a clear message.
#include <gtest/gtest.h>

#include <string>

#include "tests/support/run_command.hpp"

namespace meshtest::test_support {
namespace test_run_command {

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(RunCommand, CollectsStdoutStderrAndTheExitCode) {
  const CommandResult r = run_command("echo to-out; echo to-err >&2; exit 3");
  EXPECT_EQ(r.status, 3);
  EXPECT_FALSE(r.timed_out);
  EXPECT_TRUE(has(r.out, "to-out")) << r.out;
  EXPECT_TRUE(has(r.out, "to-err")) << r.out;
}

TEST(RunCommand, KeepsQuotesAndEnvironmentPrefixes) {
  const CommandResult r = run_command("X='a b' /bin/sh -c 'echo \"[$X]\"'");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, "[a b]\n");
}

TEST(RunCommand, AHungCommandIsStoppedWithExit124) {
  const CommandResult r = run_command("echo started; sleep 30", 1);
  EXPECT_EQ(r.status, kTimedOutStatus) << r.out;
  EXPECT_TRUE(r.timed_out);
  EXPECT_TRUE(has(r.out, "started")) << r.out;
  EXPECT_TRUE(has(r.out, "run_command: timed out after 1 s (exit 124): echo started; sleep 30"))
      << r.out;
}

TEST(RunCommand, ACommandExiting124ItselfIsNotATimeout) {
  const CommandResult r = run_command("exit 124");
  EXPECT_EQ(r.status, 124);
  EXPECT_FALSE(r.timed_out);
  EXPECT_FALSE(has(r.out, "timed out")) << r.out;
}

}  // namespace test_run_command
}  // namespace meshtest::test_support
