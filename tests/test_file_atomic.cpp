// write_file_atomic (reports, checkpoints, .npy, .safetensors and flight dumps all write through
// it): a reader sees the old file or the whole new one, and a process that dies in the middle
// of a write (here: killed by the file size limit) leaves the old file.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "src/core/file.hpp"
#include "tests/support/expect_error.hpp"
#include "tests/support/temp_dir.hpp"

namespace meshtest {
namespace test_file_atomic {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write(const fs::path& p, std::string_view text) {
  const auto b = std::as_bytes(std::span(text));
  write_file_atomic(p, std::span(&b, 1));
}

/// The names in `dir`, sorted.
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::ranges::sort(out);
  return out;
}

/// Limits the files this process may write to 256 KiB, then writes `bytes` to `p`.
void write_limited_to_256k(const fs::path& p, std::span<const std::byte> bytes) {
  rlimit limit{};
  limit.rlim_cur = limit.rlim_max = 256 << 10;
  ::setrlimit(RLIMIT_FSIZE, &limit);
  write_file_atomic(p, std::span(&bytes, 1));
}

TEST(WriteFileAtomic, ReplacesTheWholeFileAndLeavesNoTempFile) {
  const test_support::TempDir dir("atomic_replace");
  const fs::path p = dir.path() / "report.csv";
  write(p, "old contents, longer than the new ones\n");
  const std::string a = "new ", b = "contents\n";
  const std::vector<std::span<const std::byte>> parts = {std::as_bytes(std::span(a)),
                                                         std::as_bytes(std::span(b))};
  write_file_atomic(p, parts);
  EXPECT_EQ(slurp(p), "new contents\n");
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"report.csv"});
}

TEST(WriteFileAtomic, AnUnwritablePlaceIsAnErrorNamingTheFile) {
  const test_support::TempDir dir("atomic_error");
  const fs::path p = dir.path() / "no_such_dir" / "config.json";
  test_support::expect_error([&] { write(p, "{}"); },
                             {"cannot write '" + p.string() + "'", "cannot create temp file"});
  EXPECT_TRUE(names_in(dir.path()).empty());
}

TEST(WriteFileAtomicDeathTest, AProcessThatDiesMidWriteLeavesTheOldFile) {
  const test_support::TempDir dir("atomic_crash");
  const fs::path p = dir.path() / "config.json";
  const std::string old = "{\"hidden_size\": 64}\n";
  write(p, old);
  // The process may write 256 KiB into any file, and the new contents are 1 MiB: the kernel
  // kills it with SIGXFSZ in the middle of the temp file.
  const std::string next(1 << 20, 'x');
  const auto bytes = std::as_bytes(std::span(next));
  EXPECT_EXIT(write_limited_to_256k(p, bytes), ::testing::KilledBySignal(SIGXFSZ), "");
  EXPECT_EQ(slurp(p), old) << "the old file must survive a crash in the middle of a write";
  // What the dead process wrote lies only under a temp name beside it (removed with the
  // directory; never renamed over the file).
  for (const std::string& n : names_in(dir.path())) {
    if (n == "config.json") continue;
    EXPECT_TRUE(n.starts_with("config.json.tmp.")) << n;
  }
}

}  // namespace test_file_atomic
}  // namespace meshtest
