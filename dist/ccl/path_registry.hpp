// path_registry: the CCLs' paths, registered by themselves, and the choice of a call's path (the
// exchange that runs a call on them: exchange.hpp). The built-in paths live one per folder of
// dist/ccl/paths/: folder <f> defines install_<f>_path(), which the build calls once from a list it
// makes of the folders (cmake/builtin_paths.cmake), so a new path is a new folder and nothing else
// here; the GPU side registers its path on first use, a test its own for a scope (ScopedPath).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dist/ccl/path.hpp"

namespace meshtest::dist::detail {

/// Adds `path` to the registry. Process-wide, not thread-safe against running collectives;
/// every process of a job must register the same paths (their order decides alike). An Error
/// when a path of the same name is registered, or the name is empty or holds a comma.
void register_path(Path& path);
/// Removes `path` (nothing when it is not registered).
void unregister_path(Path& path);

/// Registers a path for a scope.
class ScopedPath {
 public:
  explicit ScopedPath(Path& path) : path_(path) { register_path(path); }
  ~ScopedPath() { unregister_path(path_); }
  ScopedPath(const ScopedPath&) = delete;
  ScopedPath& operator=(const ScopedPath&) = delete;

 private:
  Path& path_;
};

/// Every registered path, by memory (host first), then priority (highest first), then name.
const std::vector<Path*>& registered_paths();
/// The registered path named `name`, or nullptr.
Path* find_path(std::string_view name);
/// The registered paths, e.g. "shm (host memory, one node, priority 300), mpi (host memory, any
/// group, priority 100)", for messages.
std::string describe_paths();

/// The variable that chooses the paths of a whole run: a comma-separated list of path names;
/// a call takes the first named path that moves its operand's memory (none named for that
/// memory: the registry's order). A call's own option (`path` in each options struct) comes
/// first. Read at the process's first collective (as NCCL reads its variables once: a getenv
/// per call cost about 0.2 us); a program that sets it later calls reread_path_env().
inline constexpr const char* kPathEnv = "MESHTEST_CCL_PATH";
/// Reads kPathEnv again at the next collective.
void reread_path_env();

/// A call's choice of path: the path, or nullptr (none named for its memory: the registry's
/// order); `error` says why a name cannot be taken (a name that is no path, an option naming a
/// path of another memory), for the call to report on every device.
struct PathChoice {
  Path* path = nullptr;
  std::string error;
};
/// The path a call is to take, from its option `path` or else kPathEnv, for an operand in
/// `memory`.
PathChoice choose_path(std::string_view option, Memory memory);
/// The AgreedOption of a chosen path (its name's hash; printed as the name).
AgreedOption path_option(const Path& path);
/// The names of the registered paths of one memory in order, "shm, node_chain, mpi" ("none").
std::string path_names(Memory::Kind memory);
/// "one node" or "any group".
std::string_view reach_name(Reach r);

}  // namespace meshtest::dist::detail

namespace meshtest::dist {

/// A registered path's report on one communicator (path_reports).
struct PathReport {
  std::string name;
  Memory::Kind memory = Memory::Kind::host;
  std::string status;                  ///< Path::status: empty while it holds nothing there
  std::optional<PathTraffic> traffic;  ///< where the path counts what it moves
};

/// Every registered path's report on `comm`, in the order calls try them (host memory first, then
/// priority): which paths hold something for the group and what they have moved, for benches and
/// reports. Local; the shared-memory path's set-up is made by the group's first agreed call.
std::vector<PathReport> path_reports(MPI_Comm comm);

}  // namespace meshtest::dist
