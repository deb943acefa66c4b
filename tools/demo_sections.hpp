// Sections of meshtest-demo beyond the CCL table: one function per section, each in its own
// tools/demo_<section>.cpp. Each is collective over the mesh, prints on rank 0 and returns the
// number of failed checks (the same on every rank).
#pragma once

#include "dist/mesh/mesh_device.hpp"

namespace meshtest::dist {

/// A tiny gpt-oss decoder layer, TP on axis 1 and tokens on axis 0, against one device: PCC,
/// the aggregated per-op perf table, e2e time and reports/demo/ (tools/demo_gpt_oss.cpp).
int demo_gpt_oss(const MeshDevice& mesh);

/// FSDP DP-SGD on the mesh against one device: parameter difference after 5 noisy steps,
/// per-sample norms, mode time ratios (tools/demo_dpsgd.cpp).
int demo_dpsgd(const MeshDevice& mesh);

/// The MoE MLP block expert parallel (EP on axis 0, TP on axis 1) against mlp_block on one
/// device, the tokens and experts of each EP device, and a capacity run's dropped slots
/// (tools/demo_moe.cpp).
int demo_moe(const MeshDevice& mesh);

}  // namespace meshtest::dist
