// Subcommand registry and dispatch.
#include "tools/subcommand.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "src/core/eigen_cache.hpp"
#include "src/core/error.hpp"

namespace meshtest::tools {

namespace {
std::vector<Subcommand>& registry() {
  static std::vector<Subcommand> all;
  return all;
}

void print_help(std::FILE* out, std::string_view program, std::string_view about) {
  fmt::print(out, "{}\n\nUsage: {} <subcommand> [options]   ({} <subcommand> --help)\n\n", about,
             program, program);
  for (const Subcommand& s : subcommands()) fmt::print(out, "  {:<16} {}\n", s.name, s.summary);
}
}  // namespace

const std::vector<Subcommand>& subcommands() { return registry(); }

RegisterSubcommand::RegisterSubcommand(Subcommand s) {
  auto& all = registry();
  all.insert(
      std::upper_bound(all.begin(), all.end(), s,
                       [](const Subcommand& a, const Subcommand& b) { return a.name < b.name; }),
      s);
}

int dispatch(std::string_view program, std::string_view about, int argc, char** argv) {
  if (argc < 2) {
    print_help(stderr, program, about);
    return 2;
  }
  const std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    print_help(stdout, program, about);
    return 0;
  }
  try {
    apply_eigen_cache_env();
  } catch (const Error& e) {
    fmt::print(stderr, "{}: error: {}\n", program, e.what());
    return 2;
  }
  for (const Subcommand& s : subcommands()) {
    if (s.name != name) continue;
    std::string argv0 = fmt::format("{} {}", program, name);
    argv[1] = argv0.data();
    return s.main(argc - 1, argv + 1);
  }
  fmt::print(stderr, "{}: unknown subcommand '{}'\n\n", program, name);
  print_help(stderr, program, about);
  return 2;
}

}  // namespace meshtest::tools
