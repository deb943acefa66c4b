// DP under tensor parallelism: per-sample norms when a Linear's output features are split
// over a mesh axis (each device holds part of every sample's gradient).
#pragma once

#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "src/dp/modes.hpp"

namespace meshtest::dist {

/// A model `prefix` (replicated on every device of the axis) followed by one column-parallel
/// Linear: device r holds rows split_range(out, N, r) of its weight [out, in] and bias [out].
/// The mse loss decomposes over output features, so each device's loss is that of its slice.
struct ColumnParallelModel {
  dp::Sequential prefix;  ///< replicated layers (may be empty)
  dp::Sequential head;    ///< one Linear: this device's rows of the split layer
};

/// Splits `model`'s last layer (a Linear) by output features over `axis`; the other layers are
/// replicated. Local: every device calls it with the same model.
ColumnParallelModel split_last_linear(const MeshDevice& mesh, const dp::Sequential& model,
                                      int axis = kAllAxes);

/// The clipped gradients of a tensor-parallel model (book-keeping).
struct TpDpGrads {
  Tensor norms;  ///< [B] ‖∇θ ℓ_i‖ over the whole model, on every device
  Tensor coef;   ///< [B] clip coefficients
  std::vector<Tensor> prefix_grads;  ///< Σ_i c_i ∇ℓ_i of the replicated parameters (whole)
  std::vector<Tensor> head_grads;    ///< the same for this device's rows of the split Linear
};

/// Collective over `axis`: forward, the head's output grads, the input grad of the head summed
/// over the axis (all_reduce), backward through the prefix; per-sample squared norms of the
/// head's local rows plus — on axis index 0 only, so replicated parameters count once — the
/// prefix's; then ONE all_reduce of those B partial values gives every device the full norms.
/// Only mse (a per-feature-separable loss) is supported.
///   x: [B, (T,) d] the same on every device; y: this device's slice of the mse targets
///   [B, (T,) out_r]. Throws Error (on every device alike) for bad input.
TpDpGrads tp_clipped_grads(const MeshDevice& mesh, ColumnParallelModel& model, const Tensor& x,
                           const Tensor& y, const dp::DpOptions& opt, int axis = kAllAxes);

}  // namespace meshtest::dist
