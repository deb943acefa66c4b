// Subcommands of a multi-command program (meshtest-run gpt-oss, meshtest-bench ccl, ...):
// each subcommand lives in its own file and registers itself; main() dispatches.
#pragma once

#include <string_view>
#include <vector>

namespace meshtest::tools {

/// One subcommand: its name, a one-line summary for --help, and its main. `main` receives
/// argv[0] = "<program> <name>" followed by the subcommand's own arguments; it returns the
/// exit code (0 ok, 1 a check failed, 2 bad input).
struct Subcommand {
  std::string_view name;
  std::string_view summary;
  int (*main)(int argc, char** argv);
};

/// The subcommands registered in this program, in name order.
const std::vector<Subcommand>& subcommands();

/// Registers a subcommand at static-initialization time (one object per subcommand file).
struct RegisterSubcommand {
  explicit RegisterSubcommand(Subcommand s);
};

/// The whole main() of a multi-command program: `<program> --help`, `<program> help`,
/// `<program> <name> [args]`. Unknown names print the list and return 2.
int dispatch(std::string_view program, std::string_view about, int argc, char** argv);

}  // namespace meshtest::tools
