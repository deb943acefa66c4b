// Replays fuzz inputs without libFuzzer: runs a target on every file of the given files and
// directories (recursively, in name order) and prints how many inputs it ran.
//   fuzz_replay_<target> PATH... [--if-present PATH]...
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.hpp"

namespace fs = std::filesystem;

namespace {

/// The files under `path` (itself, if it is a file), sorted.
std::vector<fs::path> inputs_of(const fs::path& path) {
  std::vector<fs::path> out;
  if (fs::is_regular_file(path)) return {path};
  for (const auto& e : fs::recursive_directory_iterator(path)) {
    if (e.is_regular_file()) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool optional = arg == "--if-present";
    if (optional && ++i == argc) {
      std::fprintf(stderr, "%s: --if-present needs a path\n", argv[0]);
      return 2;
    }
    const fs::path path = argv[i];
    if (!fs::exists(path)) {
      if (optional) continue;
      std::fprintf(stderr, "%s: no such file or directory: %s\n", argv[0], path.c_str());
      return 2;
    }
    for (const fs::path& f : inputs_of(path)) files.push_back(f);
  }
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    // Named before it runs: a sanitizer report or an abort ends the process.
    std::printf("input %s (%zu bytes)\n", f.c_str(), bytes.size());
    std::fflush(stdout);
    try {
      LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s: an exception other than meshtest::Error escaped: %s\n", argv[0],
                   f.c_str(), e.what());
      return 1;
    }
  }
  std::printf("replayed %zu inputs\n", files.size());
  if (files.empty()) {
    std::fprintf(stderr, "%s: no inputs to replay\n", argv[0]);
    return 1;
  }
  return 0;
}
