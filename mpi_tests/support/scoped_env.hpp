// Test helper: an environment variable set (or unset) for a scope, restored at its end.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace meshtest::test_support {

/// Sets `name` to `value` (nullopt: unsets it) in this process until the end of the scope, then
/// restores what it was. Every rank of an MPI test sets its own.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::optional<std::string>& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(old_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const std::optional<std::string>& value) const {
    if (value) {
      ::setenv(name_.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace meshtest::test_support
