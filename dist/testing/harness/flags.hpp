// Command-line flags of a test program, --meshtest_<name>=<value>: declared by the code that
// reads them (a kit on the harness), taken out of argv by run_all_tests, listed by --help.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace meshtest::dist::testing {

/// A flag --<name>=<value>.
struct HarnessFlag {
  std::string name = {};   ///< "meshtest_checkpoint": "meshtest_" then [a-z0-9_]+
  std::string value = {};  ///< what the value is, for --help: "DIR"
  std::string help = {};   ///< one line for --help
};

/// Declares a flag, so that run_all_tests accepts it and --help lists it. Call it during static
/// initialization, in the .cpp that reads the flag:
///   [[maybe_unused]] const bool kDeclared = declare_harness_flag({.name = "meshtest_x", ...});
/// Returns true. Throws Error for a malformed name, an empty value or help, or a name declared
/// twice.
bool declare_harness_flag(HarnessFlag flag);

/// The value of --<name>=VALUE on the command line that run_all_tests took (the last one when
/// given more than once), or nullopt: not given, or run_all_tests has not taken the command
/// line (a program without the harness's main). Throws Error for a name not declared.
std::optional<std::string> harness_flag(std::string_view name);

namespace detail {

/// Takes every argument that starts with "--meshtest" out of argv (run_all_tests, after
/// InitGoogleTest) and keeps it for harness_flag. Throws Error naming the argument for one that
/// is not --<name>=<value> with a declared name and a non-empty value (the message lists the
/// declared flags); takes nothing then.
void take_harness_flags(int& argc, char** argv);

/// Whether the arguments left after InitGoogleTest ask for GoogleTest's help: --help (or -h,
/// -?, /?) or a --gtest_ flag GoogleTest does not know.
bool asks_for_help(int argc, char** argv);

/// The --help section of the declared flags; "" when there are none.
std::string harness_flags_help();

}  // namespace detail

}  // namespace meshtest::dist::testing
