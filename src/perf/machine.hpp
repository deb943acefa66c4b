// The machine a timing belongs to: perf expectations are recorded on one machine and held only
// against runs on that machine (docs/perf.md, "Perf expectations").
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace meshtest::perf {

/// What tells one machine's timings from another's.
struct Machine {
  std::string host;  ///< gethostname
  std::string cpu;   ///< /proc/cpuinfo's first "model name" ("unknown CPU" where none)
  int threads = 0;   ///< std::thread::hardware_concurrency
  bool operator==(const Machine&) const = default;
};

/// The CPU's model name from /proc/cpuinfo, or "unknown CPU".
std::string cpu_model_name();

/// This machine.
Machine this_machine();

/// "host <host>, <cpu>, <threads> hardware threads".
std::string describe(const Machine& m);

/// {"host": ..., "cpu": ..., "threads": ...}, pretty-printed with a final newline.
std::string machine_json(const Machine& m);

/// Parses machine_json's form; `where` names the source in errors (a missing or mistyped field
/// is an Error naming it).
Machine parse_machine(std::string_view json_text, std::string_view where);

/// parse_machine of the file at `path`; an Error names a file that cannot be read.
Machine read_machine(const std::filesystem::path& path);

}  // namespace meshtest::perf
