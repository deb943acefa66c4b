// agree_or_throw: a local input check whose failure on any device makes every device throw.
#pragma once

#include <functional>
#include <string_view>

#include "dist/mesh/mesh_device.hpp"

namespace meshtest::dist {

/// Collective over `axis` of `mesh`: runs `check` (which throws meshtest::Error for bad input)
/// on every device, then agrees: if it failed anywhere, every device throws the same Error,
/// "<what>: device <id>: <message of the lowest failing device>". Never leaves a device waiting
/// in a later collective.
void agree_or_throw(const MeshDevice& mesh, int axis, std::string_view what,
                    const std::function<void()>& check);

/// Collective: the AND of `v` over the devices of `axis`.
bool all_devices(const MeshDevice& mesh, int axis, bool v);

}  // namespace meshtest::dist
