// FsdpDpSgd: DP-SGD under FSDP. Each device holds 1/N of every parameter (array_split of its
// flattened elements) and its own samples; layers are all-gathered before their forward and
// backward and freed after; clipped gradients are reduce-scattered; noise and the optimizer
// act on the shards.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "src/dp/dp_sgd.hpp"

namespace meshtest::dist {

/// FSDP DP-SGD over the devices of one mesh axis (kAllAxes: the whole mesh).
///
/// Sharding: parameter p (flattened, n_p elements) lives on device r of the axis as elements
/// split_range(n_p, N, r) (numpy array_split; a device may hold none). Samples: each device
/// passes its own; the mean divides by the global batch. Per-sample norms are complete on the
/// device that owns the sample and are never reduced across devices. Noise for element j of
/// parameter p at step s is keyed by (seed, s, p, j), so the run equals a single device's
/// DP-SGD on the concatenated batch up to floating-point summation order.
///
/// Collective: every device of the axis constructs it and calls step() with the same options
/// and model (only the batch differs); bad input on any device makes every device throw.
///
/// Lifetime: it keeps a reference to `mesh` (not a copy: a MeshDevice owns communicators), so
/// the mesh must outlive it; passing a temporary MeshDevice does not compile. `model` is copied.
class FsdpDpSgd {
 public:
  /// `model`: the same full model on every device; each device keeps only its shards.
  FsdpDpSgd(const MeshDevice& mesh, const dp::Sequential& model, dp::DpSgdOptions opt,
            int axis = kAllAxes);
  /// Deleted: the mesh would be destroyed while this still refers to it.
  FsdpDpSgd(MeshDevice&& mesh, const dp::Sequential& model, dp::DpSgdOptions opt,
            int axis = kAllAxes) = delete;

  /// One step on this device's samples.   x: [B_r, (T,) d], y: as the loss needs (B_r may be 0)
  /// Returns this device's per-sample norms and clip coefficients [B_r] and its local loss.
  dp::StepReport step(const Tensor& x, const Tensor& y);

  /// One step's noisy clipped gradient without the update: this device's shard of each
  /// parameter's gradient (Σ_i c_i ∇ℓ_i over the global batch + noise, ÷ B for mean), the report
  /// of its samples and the global batch. step() is this plus the optimizer.
  struct NoisyGrads {
    dp::StepReport report = {};
    std::vector<Tensor> shard_grads = {};
    std::int64_t global_batch = 0;
  };
  NoisyGrads noisy_grads(const Tensor& x, const Tensor& y);

  /// Collective: every parameter gathered whole (model order, PyTorch shapes).
  std::vector<Tensor> gather_parameters() const;
  /// This device's flat shard of each parameter.
  const std::vector<Tensor>& shards() const { return shards_; }
  /// The model; its parameter values are freed (unset) outside step().
  const dp::Sequential& model() const { return pm_.model(); }
  std::int64_t steps() const { return optimizer_.step(); }

 private:
  void gather_layer(std::size_t layer);
  void free_layer(std::size_t layer);

  const MeshDevice* mesh_;  // not owned: the caller's mesh, which outlives this
  int axis_;
  dp::DpSgdOptions opt_;
  dp::PrivateModel pm_;
  dp::Optimizer optimizer_;
  std::vector<Tensor> shards_;
};

}  // namespace meshtest::dist
