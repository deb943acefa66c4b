// GpuFsdpDpSgd: DP-SGD under FSDP on GPU ranks — dist::FsdpDpSgd's sharding, agreement, noise
// and optimizer (dist/parallel/fsdp.hpp) over the GPU model of src/gpu/dp_model.hpp, each
// layer's parameters all-gathered and the clipped gradients reduce-scattered on device tensors
// over the mesh's NCCL axis with the exact numerics (dist/gpu/ccl/ccl.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "src/dp/dp_sgd.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/dp_model.hpp"

namespace meshtest::dist {

/// FSDP DP-SGD over the devices of one mesh axis (kAllAxes: the whole mesh), one GPU per device.
///
/// Sharding: as FsdpDpSgd's — parameter p (flattened, n_p elements) lives on device r of the
/// axis as elements split_range(n_p, N, r), on the device's GPU (a device may hold none). Each
/// layer's parameters are all-gathered before each of its passes (forward, each backward) and
/// freed after; each parameter's clipped gradient sum is reduce-scattered. Samples: each device
/// passes its own; the mean divides by the global batch; per-sample norms are complete on the
/// device that owns the sample and are never reduced across devices.
///
/// Numerics: the exact collectives add the devices' partial sums in axis order, so a step is the
/// one-GPU step on the concatenated batch up to the order of the clipped sum over samples (and
/// the CPU's DpSgd within the error model of docs/tolerances.md). The noise of element j of
/// parameter p at step s is keyed by (seed, s, p, j) and added to the shard on the host
/// (dp::add_noise), so it does not depend on N. The optimizer: SGD on the GPU (one axpy per
/// shard); Adam by dp::Optimizer on a host copy of the shards.
///
/// Collective: every device of the axis constructs it and calls step() with the same options and
/// model (only the batch differs); bad input on any device makes every device throw, naming it.
/// Memory: the constructor holds the whole model on each GPU once, while it cuts the shards.
///
/// Lifetime: it keeps references to `mesh` and `blas` (a MeshDevice owns communicators), which
/// must outlive it; a temporary MeshDevice does not compile.
class GpuFsdpDpSgd {
 public:
  /// `model`: the same full model on every device (Linear, ReLU, GELU, RMSNorm: what the GPU
  /// model takes); `blas` on this rank's GPU. Throws Error for an unknown mode, a bad clip or
  /// sigma (the same on every device: the options are).
  GpuFsdpDpSgd(const MeshDevice& mesh, meshtest::gpu::Blas& blas, const dp::Sequential& model,
               dp::DpSgdOptions opt, int axis = kAllAxes);
  /// Deleted: the mesh would be destroyed while this still refers to it.
  GpuFsdpDpSgd(MeshDevice&& mesh, meshtest::gpu::Blas& blas, const dp::Sequential& model,
               dp::DpSgdOptions opt, int axis = kAllAxes) = delete;
  ~GpuFsdpDpSgd();
  GpuFsdpDpSgd(const GpuFsdpDpSgd&) = delete;
  GpuFsdpDpSgd& operator=(const GpuFsdpDpSgd&) = delete;

  /// One step on this device's samples (on its GPU). x: [B_r, (T,) d], y: as the loss needs
  /// (B_r may be 0). Returns this device's per-sample norms and clip coefficients [B_r] (host)
  /// and its local loss. Complete when it returns.
  dp::StepReport step(const meshtest::gpu::DeviceTensor& x, const meshtest::gpu::DeviceTensor& y);

  /// Collective: every parameter gathered whole, on the host (model order, PyTorch shapes).
  std::vector<Tensor> gather_parameters() const;
  /// This device's flat shard of each parameter, on its GPU.
  const std::vector<meshtest::gpu::DeviceTensor>& shards() const { return shards_; }
  /// Whether layer k's parameters are held whole now (only inside step(): false after it).
  bool gathered(std::size_t layer) const;
  std::int64_t steps() const { return optimizer_.step(); }

 private:
  void gather_layer(std::size_t layer);
  void free_layer(std::size_t layer);

  const MeshDevice* mesh_;  // not owned: the caller's, which outlive this
  meshtest::gpu::Blas* blas_;
  int axis_;
  dp::DpSgdOptions opt_;
  meshtest::gpu::dp::Model model_;
  dp::Optimizer optimizer_;
  std::vector<Shape> shapes_;       // every parameter's, model order
  std::vector<std::size_t> first_;  // layer k's first parameter index
  std::vector<meshtest::gpu::DeviceTensor> shards_;
};

}  // namespace meshtest::dist
