// path_registry: the registered paths in their order, the path a call chooses, and the errors of
// a choice that cannot be taken.
#include "dist/ccl/path_registry.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>

#include "src/core/error.hpp"

namespace meshtest::dist::detail {

/// Generated from the folders of dist/ccl/paths (cmake/builtin_paths.cmake): calls each
/// folder's install_<folder>_path().
void install_builtin_paths();

namespace {

std::vector<Path*>& installed() {
  static std::vector<Path*> paths;
  return paths;
}

/// The registry, the built-in paths installed on first use.
std::vector<Path*>& paths() {
  static const bool builtin = [] {
    install_builtin_paths();
    return true;
  }();
  (void)builtin;
  return installed();
}

/// kPathEnv as read at the first call since the start or reread_path_env().
struct PathEnv {
  bool read = false;
  std::string value;
};
PathEnv& path_env_state() {
  static PathEnv env;
  return env;
}
std::string_view path_env() {
  PathEnv& e = path_env_state();
  if (!e.read) {
    const char* v = std::getenv(kPathEnv);
    e.value = v != nullptr ? v : "";
    e.read = true;
  }
  return e.value;
}

/// FNV-1a of a path's name: what the group agrees on when a call chooses a path.
std::int64_t name_hash(std::string_view name) {
  std::uint64_t h = 14695981039346656037ULL;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return static_cast<std::int64_t>(h);
}

std::string show_path(std::int64_t hash) {
  for (const Path* p : paths()) {
    if (name_hash(p->name()) == hash) return std::string(p->name());
  }
  return fmt::format("(a path not registered here, hash {})", hash);
}

/// `all` for messages: "mpi (host memory, any group, priority 100), ...".
std::string describe(const std::vector<Path*>& all) {
  std::string out;
  for (const Path* p : all) {
    const PathInfo& i = p->info();
    out += fmt::format("{}{} ({} memory, {}, priority {})", out.empty() ? "" : ", ", i.name,
                       kind_name(Memory{.kind = i.memory}), reach_name(i.reach), i.priority);
  }
  return out.empty() ? "none registered" : out;
}

}  // namespace

std::string_view reach_name(Reach r) { return r == Reach::one_node ? "one node" : "any group"; }

std::string path_names(Memory::Kind kind) {
  std::string out;
  for (const Path* p : paths()) {
    if (p->info().memory != kind) continue;
    out += fmt::format("{}{}", out.empty() ? "" : ", ", p->name());
  }
  return out.empty() ? "none" : out;
}

void register_path(Path& path) {
  const PathInfo& info = path.info();
  MESHTEST_CHECK(!info.name.empty() && info.name.find(',') == std::string_view::npos,
                 "register_path: a path's name must be non-empty and hold no comma, not '{}'",
                 info.name);
  // installed(), not paths(): the built-in paths register while paths() installs them.
  std::vector<Path*>& all = installed();
  MESHTEST_CHECK(std::ranges::none_of(all, [&](const Path* p) { return p->name() == info.name; }),
                 "register_path: a path named '{}' is registered already (the paths: {})",
                 info.name, describe(all));
  all.push_back(&path);
  std::ranges::stable_sort(all, [](const Path* a, const Path* b) {
    const PathInfo &x = a->info(), &y = b->info();
    return std::tuple(x.memory, -x.priority, x.name) < std::tuple(y.memory, -y.priority, y.name);
  });
}

void unregister_path(Path& path) { std::erase(paths(), &path); }

const std::vector<Path*>& registered_paths() { return paths(); }

Path* find_path(std::string_view name) {
  for (Path* p : paths()) {
    if (p->name() == name) return p;
  }
  return nullptr;
}

std::string describe_paths() { return describe(paths()); }

void reread_path_env() { path_env_state().read = false; }

PathChoice choose_path(std::string_view option, Memory memory) {
  if (!option.empty()) {
    Path* p = find_path(option);
    if (p == nullptr) {
      return {.error = fmt::format(
                  "the option path names '{}', and no path has that name (the paths: {})", option,
                  describe_paths())};
    }
    if (p->info().memory != memory.kind) {
      return {.error = fmt::format(
                  "the option path names '{}', which moves {} memory, and this call's operand is "
                  "in {} memory (the paths of {} memory: {})",
                  option, kind_name(Memory{.kind = p->info().memory}), kind_name(memory),
                  kind_name(memory), path_names(memory.kind))};
    }
    return {.path = p, .error = {}};
  }
  const std::string_view env = path_env();
  if (env.empty()) return {};
  PathChoice choice;
  std::string_view rest = env;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view name = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    Path* p = find_path(name);
    if (p == nullptr) {
      return {.error = fmt::format("{} is '{}', and '{}' is no path (the paths: {})", kPathEnv, env,
                                   name, describe_paths())};
    }
    if (choice.path == nullptr && p->info().memory == memory.kind) choice.path = p;
  }
  return choice;
}

AgreedOption path_option(const Path& path) {
  return {"path (the option, or MESHTEST_CCL_PATH)", name_hash(path.name()), &show_path};
}

}  // namespace meshtest::dist::detail

namespace meshtest::dist {

std::vector<PathReport> path_reports(MPI_Comm comm) {
  std::vector<PathReport> out;
  for (const detail::Path* p : detail::registered_paths()) {
    out.push_back({.name = std::string(p->name()),
                   .memory = p->info().memory,
                   .status = p->status(comm),
                   .traffic = p->traffic(comm)});
  }
  return out;
}

}  // namespace meshtest::dist
