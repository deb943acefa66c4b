// expect_matches_single_device: a sharded op on the mesh against its single-device reference.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "dist/shard/placement.hpp"
#include "src/check/compare.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist::testing {

/// One input of the op: the whole tensor (the same on every device) and its placements.
struct ShardedInput {
  Tensor full = {};
  Placements placements = kReplicated;
};

/// How the gathered result is compared with the reference.
struct MatchOptions {
  Metric metric = Metric::pcc;                        ///< see meshtest::Metric for the pass rule
  double threshold = 0.9999;                          ///< ignored for allclose, exact and model
  std::optional<Tolerance> tolerance = std::nullopt;  ///< set: compare by allclose under it
  /// set: compare under the error model, with the tensor's scale max |expected| (the metric,
  /// threshold and tolerance are then ignored; src/check/tolerance.hpp)
  std::optional<ErrorModel> model = std::nullopt;
  std::string label = {};  ///< the test's parameters, printed on failure

  /// compare(expected, got) under the model, else the tolerance, else the metric.
  Comparison compare(const Tensor& expected, const Tensor& got) const;
};

/// The reference: the single-device op on the full inputs, in order.
using ReferenceFn = std::function<Tensor(const std::vector<Tensor>& full)>;
/// The sharded op: this device's shards of the inputs, in order; returns this device's shard
/// of the output (placed as `output` says).
using ShardedFn = std::function<Tensor(const MeshDevice& mesh, const std::vector<Tensor>& local)>;

/// Collective over the mesh (every device calls it with the same arguments). Distributes each
/// input by its placements, runs `sharded` on every device, gathers the output (gather_full
/// with `output`), runs `reference` on device 0 and compares there. On a failed comparison,
/// device 0 records one gtest failure naming the label, the mesh, the placements, the metric,
/// its value and threshold, the worst element and the device that owns it (when the output is
/// sharded on one axis: the device index along that axis). Every device returns the
/// Comparison with the same `passed` and `value`; the other fields are filled on device 0.
Comparison expect_matches_single_device(const MeshDevice& mesh,
                                        const std::vector<ShardedInput>& inputs,
                                        const ReferenceFn& reference, const ShardedFn& sharded,
                                        const Placements& output = kReplicated,
                                        const MatchOptions& options = {});

}  // namespace meshtest::dist::testing
