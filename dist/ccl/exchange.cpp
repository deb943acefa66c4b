// exchange: the errors of a call that no path takes.
#include "dist/ccl/exchange.hpp"

namespace meshtest::dist::detail {

void chosen_path_failed(const Call& call, const Path& path, bool declined) {
  const PathInfo& i = path.info();
  if (declined) {
    call.fail(
        "path {} was chosen (the option path, or {}) and declines this call; leave the choice "
        "to the registry for it (the paths of {} memory in order: {})",
        i.name, kPathEnv, kind_name(call.memory()), path_names(call.memory().kind));
  }
  call.fail(
      "path {} was chosen (the option path, or {}) and does not apply to this call's group of "
      "{} device{} (it applies to {}; the paths of {} memory in order: {})",
      i.name, kPathEnv, call.size(), call.size() == 1 ? "" : "s", reach_name(i.reach),
      kind_name(call.memory()), path_names(call.memory().kind));
}

void no_path(const Call& call) {
  call.fail("no path moves this call's data (operand in {} memory; the paths of that memory: {})",
            kind_name(call.memory()), path_names(call.memory().kind));
}

}  // namespace meshtest::dist::detail
