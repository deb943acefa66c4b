// The flag registry: declarations, the flags taken from the command line, the --help section.
#include "dist/testing/harness/flags.hpp"

#include <fmt/format.h>

#include <functional>
#include <map>
#include <utility>

#include "src/core/error.hpp"

namespace meshtest::dist::testing {

namespace {

struct Registry {
  std::map<std::string, HarnessFlag, std::less<>> declared;
  std::map<std::string, std::string, std::less<>> given;
};

/// Never destroyed: declarations run during static initialization, reads may come at exit.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

constexpr std::string_view kPrefix = "meshtest_";

bool valid_name(std::string_view name) {
  return name.size() > kPrefix.size() && name.starts_with(kPrefix) &&
         name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string_view::npos;
}

/// Whether a command-line argument is one of these flags (or meant to be one).
bool is_flag(std::string_view arg) { return arg.starts_with("--meshtest"); }

/// "--meshtest_a=DIR, --meshtest_b=N" or a sentence saying there are none.
std::string declared_list(const Registry& r) {
  if (r.declared.empty()) return "this program has no --meshtest_ flags";
  std::string s = "this program's flags:";
  const char* separator = " ";
  for (const auto& [name, flag] : r.declared) {
    s += fmt::format("{}--{}={}", separator, name, flag.value);
    separator = ", ";
  }
  return s;
}

}  // namespace

bool declare_harness_flag(HarnessFlag flag) {
  MESHTEST_CHECK(valid_name(flag.name),
                 "declare_harness_flag: '{}' is not a flag name: meshtest_ then [a-z0-9_]+",
                 flag.name);
  MESHTEST_CHECK(!flag.value.empty() && !flag.help.empty(),
                 "declare_harness_flag: --{} needs a value name and a help line", flag.name);
  Registry& r = registry();
  MESHTEST_CHECK(!r.declared.contains(flag.name), "declare_harness_flag: --{} is declared twice",
                 flag.name);
  std::string name = flag.name;
  r.declared.emplace(std::move(name), std::move(flag));
  return true;
}

std::optional<std::string> harness_flag(std::string_view name) {
  const Registry& r = registry();
  MESHTEST_CHECK(r.declared.contains(name),
                 "harness_flag: --{} is not declared (declare_harness_flag); {}", name,
                 declared_list(r));
  const auto it = r.given.find(name);
  if (it == r.given.end()) return std::nullopt;
  return it->second;
}

namespace detail {

void take_harness_flags(int& argc, char** argv) {
  Registry& r = registry();
  std::map<std::string, std::string, std::less<>> given;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (!is_flag(arg)) continue;
    const std::size_t eq = arg.find('=');
    const std::string_view name = arg.substr(2, eq == std::string_view::npos ? eq : eq - 2);
    const auto flag = r.declared.find(name);
    MESHTEST_CHECK(flag != r.declared.end(), "unknown flag '{}'; {}", arg, declared_list(r));
    MESHTEST_CHECK(eq != std::string_view::npos && eq + 1 < arg.size(),
                   "flag '{}' needs a value: --{}={}", arg, name, flag->second.value);
    given.insert_or_assign(std::string(name), std::string(arg.substr(eq + 1)));
  }
  int kept = argc > 0 ? 1 : 0;
  for (int i = 1; i < argc; ++i) {
    if (!is_flag(argv[i])) argv[kept++] = argv[i];
  }
  if (kept < argc) argv[kept] = nullptr;
  argc = kept;
  r.given = std::move(given);
}

bool asks_for_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "-?" || arg == "/?") return true;
    for (const std::string_view lead : {"--", "-", "/"}) {
      if (arg.starts_with(lead)) {
        arg.remove_prefix(lead.size());
        break;
      }
    }
    if (!arg.starts_with("gtest_internal_") &&
        (arg.starts_with("gtest_") || arg.starts_with("gtest-"))) {
      return true;
    }
  }
  return false;
}

std::string harness_flags_help() {
  const Registry& r = registry();
  if (r.declared.empty()) return {};
  std::string s = "\nmeshtest flags (every rank must get the same ones):\n";
  for (const auto& [name, flag] : r.declared) {
    s += fmt::format("  --{}={}\n      {}\n", name, flag.value, flag.help);
  }
  return s;
}

}  // namespace detail

}  // namespace meshtest::dist::testing
