// mesh_arg: the --mesh option shared by the command-line programs ("RxC", or "N" for 1 x N).
#pragma once

#include <array>
#include <cstdio>
#include <string>

#include "src/core/error.hpp"

namespace meshtest::tools {

/// Parses "RxC" (or "RXC") into {R, C}, and "N" into {1, N}; R, C and N must be positive.
/// Throws Error naming the text otherwise ("--mesh expects RxC (e.g. 2x4) or N ...").
inline std::array<int, 2> parse_mesh_arg(const std::string& s) {
  int r = 0, c = 0;
  char x = 0, extra = 0;
  if (std::sscanf(s.c_str(), "%d%c%d%c", &r, &x, &c, &extra) == 3 && (x == 'x' || x == 'X') &&
      r > 0 && c > 0) {
    return {r, c};
  }
  if (std::sscanf(s.c_str(), "%d%c", &r, &extra) == 1 && r > 0) return {1, r};
  fail("--mesh expects RxC (e.g. 2x4) or N with positive R, C, N; got '{}'", s);
}

}  // namespace meshtest::tools
