// Test helper: expect a meshtest::Error whose message names what was wrong.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/core/error.hpp"

namespace meshtest::test_support {

/// Expects `f` to throw meshtest::Error whose message contains each of `parts`.
template <class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; wanted " << parts.back();
  } catch (const Error& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "want '" << part << "' in: " << e.what();
    }
  }
}

}  // namespace meshtest::test_support
