// meshtest::Error — the one exception type, and the checks that throw it.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace meshtest {

/// The one exception type of meshtest. The message says what was wrong, what
/// was expected and what was given.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// Throws meshtest::Error with an fmt-formatted message.
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace meshtest

/// Throws meshtest::Error with the formatted message when `cond` is false.
#define MESHTEST_CHECK(cond, ...)               \
  do {                                          \
    if (!(cond)) ::meshtest::fail(__VA_ARGS__); \
  } while (0)
