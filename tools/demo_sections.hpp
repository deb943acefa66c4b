// The demo's extra sections, one function each, called from tools/demo.cpp's main flow.
#pragma once

#include "dist/mesh/mesh_device.hpp"

namespace meshtest::dist {

/// Profiles a compute + CCL sequence on every device, prints the aggregated per-op table and
/// writes reports/demo/ (tools/demo_perf.cpp). Collective; returns 0 (the figures are not
/// checked against anything).
int demo_perf(const MeshDevice& mesh);

}  // namespace meshtest::dist
