// exchange: a call's data exchange on its chosen path, or on the first registered path of its
// operand's memory that applies to its group and takes it (path_registry.hpp).
#pragma once

#include "dist/ccl/detail.hpp"
#include "dist/ccl/path.hpp"
#include "dist/ccl/path_registry.hpp"

namespace meshtest::dist::detail {

/// Throws: the path chosen for `call` does not apply to it or declined it.
[[noreturn]] void chosen_path_failed(const Call& call, const Path& path, bool declined);
/// Throws: no path of `call`'s memory took it.
[[noreturn]] void no_path(const Call& call);

/// Runs exchange `take` (a member of Path) with `x` on the call's chosen path, else on the
/// first registered path of the operand's memory that applies to the call and takes it.
template <class X>
void exchange(Call& call, bool (Path::*take)(Call&, const X&), const X& x) {
  if (Path* p = call.chosen()) {
    if (!p->applies(call)) chosen_path_failed(call, *p, false);
    if (!(p->*take)(call, x)) chosen_path_failed(call, *p, true);
    return;
  }
  for (Path* p : registered_paths()) {
    if (p->info().memory != call.memory().kind || !p->applies(call)) continue;
    if ((p->*take)(call, x)) return;
  }
  no_path(call);
}

}  // namespace meshtest::dist::detail
