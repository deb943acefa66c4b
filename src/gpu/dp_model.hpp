// dp_model (GPU): a DP model (src/dp/sequential.hpp's Linear, ReLU, GELU and RMSNorm layers) on
// one GPU, and the five DP modes of src/dp/modes.hpp on it: the same norms, clip coefficients
// and clipped gradient sums as the CPU modes, by the GPU's kernels (dp.hpp, dp_model_kernel.cu)
// and cuBLAS, in f32 (no TF32) or f64.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/tensor.hpp"
#include "src/dp/modes.hpp"
#include "src/dp/sequential.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"

namespace meshtest::gpu::dp {

/// What a GPU mode computes, as meshtest::dp::DpGrads: the per-sample norms and clip
/// coefficients (on the host: B numbers; empty for non_private), the clipped gradient sums per
/// parameter (on the GPU, in Sequential::parameters() order) and the reduced loss.
struct Grads {
  Tensor norms = {};
  Tensor coef = {};
  std::vector<DeviceTensor> grads = {};
  double loss = 0;
};

/// A meshtest::dp::Sequential's layers and parameters on the GPU of `blas` (copied at
/// construction; Linear and FusedLinear alike, the mode chooses the backward), and one step of a
/// DP mode on it. The mode's backward is the CPU's, layer by layer:
///   - non_private: one backward of the reduced loss;
///   - hooks: one backward instantiating every per-sample gradient (Linear: a strided-batched
///     GEMM), their squared norms, then Σ_i c_i of them;
///   - ghost: a backward of the ghost norms (Gram matrices), then a second of Σ_i c_i ℓ_i;
///   - fused: the Linear norms by the hybrid rule inside the backward (the direct method fused
///     with the weight gradient), a second backward only when a sample is clipped or a gradient
///     is missing;
///   - fused_bk: one backward keeping each Linear's output grads (or its per-sample grads in the
///     direct regime with d_in <= T), then (diag(c) G)ᵀ A per layer.
/// The norms' square roots and the coefficients c_i = min(1, C / (‖g_i‖ + 1e-6)) are the CPU's
/// functions on the B squared norms copied back. Every method is complete when it returns.
class Model {
 public:
  /// Copies `host`'s parameters to blas.device(). Throws Error for a layer kind it lacks.
  Model(Blas& blas, const meshtest::dp::Sequential& host);
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  /// One forward and the mode's backward(s) on (x, y) (on the GPU: x [B, d] or [B, T, d] in the
  /// model's dtype, y as meshtest::dp::loss_and_grad takes it); the cached activations are freed
  /// after. Throws the CPU's Errors for the mode's name, the clip, the shapes and dtypes, and a
  /// class outside the logits (checked on the host).
  /// `hooks` (meshtest::dp::StepHooks, as the CPU modes take them): layers.before(k) and
  /// layers.after(k) around layer k's forward and each of its backwards (FSDP gathers and frees
  /// the layer's parameters there: layer_parameters), and all_of to agree, across the devices
  /// that share the passes, on whether fused needs its second backward.
  Grads compute(const DeviceTensor& x, const DeviceTensor& y, std::string_view mode,
                const meshtest::dp::DpOptions& opt, const meshtest::dp::StepHooks& hooks = {});

  /// compute's checks alone, on the host (reads y's classes for ce): the mode, the clip, x's
  /// shape, dtype and device, the features through the layers, and the loss's targets. Returns
  /// the output's shape. A collective caller runs it inside an agreement (FSDP).
  Shape check(const DeviceTensor& x, const DeviceTensor& y, std::string_view mode,
              const meshtest::dp::DpOptions& opt) const;

  /// θ −= lr · grad for every parameter (SGD; grads in parameters() order, as compute gives).
  void sgd_step(const std::vector<DeviceTensor>& grads, double lr);

  /// The parameters, copied back to the host, in Sequential::parameters() order.
  std::vector<Tensor> parameters() const;
  /// The parameters' state-dict names, in the same order.
  std::vector<std::string> names() const;
  /// The parameters' shapes, in the same order (whether or not they are held now).
  std::vector<Shape> shapes() const;
  /// The number of layers, and layer k's parameters (weight before bias), for a caller that
  /// holds them elsewhere between uses (FSDP: dist/gpu/parallel/fsdp_dp.hpp frees them, and
  /// sets them, in their shapes and the model's dtype, before compute uses layer k).
  std::size_t layers() const;
  std::vector<DeviceTensor>& layer_parameters(std::size_t k);
  const std::vector<DeviceTensor>& layer_parameters(std::size_t k) const;
  DType dtype() const { return dtype_; }

  struct Layer;  ///< (dp_model.cpp)

 private:
  Blas* blas_;
  DType dtype_;
  std::vector<Layer> layers_;
};

}  // namespace meshtest::gpu::dp
