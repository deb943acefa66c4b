// The demo's sections beyond the CCL table: one function per section, each collective over the
// mesh and returning its number of failed checks (the same on every device).
#pragma once

#include "dist/mesh/mesh_device.hpp"

namespace meshtest::dist {

int demo_dpsgd(const MeshDevice& mesh);  ///< FSDP DP-SGD on the mesh vs one device

}  // namespace meshtest::dist
