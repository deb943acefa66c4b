// The layers of a DP model: Linear, FusedLinear, ReLU, GELU and RMSNorm, with per-sample
// gradient norms in their backward.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/core/tensor.hpp"

namespace meshtest::dp {

/// One parameter of a layer. `value` may be empty while FSDP has freed it; `shape` stays.
struct Param {
  std::string name = {};     ///< PyTorch nn.Sequential state-dict name, e.g. "0.weight"
  Shape shape = {};          ///< the full shape (Linear weight [out, in], bias [out], scale [d])
  DType dtype = DType::f64;  ///< the dtype of value (kept while it is freed)
  Tensor value = {};         ///< the full parameter (empty while freed)
  Tensor grad = {};          ///< a gradient summed over samples (plain, or clipped and summed)
  Tensor grad_sample = {};   ///< [B, shape...] per-sample gradients, when a pass instantiates them
};

/// What one backward pass computes. The output grads G are those of the reduced loss; norms are
/// of the per-sample losses, ‖norm_scale · ∇ℓ‖² (norm_scale = B for a mean reduction).
struct BackwardContext {
  bool input_grad = true;      ///< set per layer by Sequential (false for the first layer)
  bool grads = true;           ///< sum the weight gradients into Param::grad
  bool grads_if_free = false;  ///< fused layers also fill Param::grad where it costs nothing
  bool norms = false;          ///< add the per-sample squared norms into norm_sq
  bool per_sample = false;     ///< instantiate per-sample gradients in Param::grad_sample (hooks)
  bool keep = false;           ///< keep the output grads for bookkeeping_grads (fused_bk)
  double norm_scale = 1;       ///< factor of G in the norms
  Tensor norm_sq = {};         ///< [B] accumulator, the model's dtype
  bool all_grads = true;       ///< cleared by a layer that left Param::grad empty
  bool last_pass = false;      ///< no later pass needs the inputs: each layer drops its input
};

/// A layer of a Sequential. forward caches what backward needs; backward returns dL/dx (empty
/// when ctx.input_grad is false).
class Layer {
 public:
  explicit Layer(std::string kind) : kind_(std::move(kind)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = default;
  Layer& operator=(const Layer&) = default;

  /// "linear", "fused_linear", "relu", "gelu" or "rmsnorm".
  const std::string& kind() const { return kind_; }
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  /// The last dim of the output for an input whose last dim is `in`; throws Error on mismatch.
  virtual std::int64_t out_features(std::int64_t in) const { return in; }

  virtual Tensor forward(const Tensor& x) = 0;
  virtual Tensor backward(const Tensor& grad_out, BackwardContext& ctx) = 0;
  /// Book-keeping: Param::grad = Σ_i c_i (gradient of sample i) from what backward kept
  /// (grad_sample by default).   coef: [B]
  virtual void bookkeeping_grads(const Tensor& coef);
  /// Drops cached activations and kept grads.
  virtual void release();
  /// After the last backward pass: drops the cached input unless book-keeping still needs it.
  virtual void drop_input() { input_ = Tensor(); }
  virtual std::unique_ptr<Layer> clone() const = 0;

 protected:
  std::string kind_ = {};
  std::vector<Param> params_;
  Tensor input_ = {};  ///< the cached input of forward
};

/// y = x Wᵀ + b with per-sample norms by instantiated per-sample grads (hooks) or by the ghost
/// method (ghost clipping).   x: [B, in] or [B, T, in] -> [B, (T,) out]
class Linear : public Layer {
 public:
  /// weight: [out, in], bias: [out] or empty for no bias; f32 or f64.
  Linear(Tensor weight, Tensor bias, int index);
  std::int64_t out_features(std::int64_t in) const override;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_out, BackwardContext& ctx) override;
  std::unique_ptr<Layer> clone() const override { return std::make_unique<Linear>(*this); }
  bool has_bias() const { return params_.size() == 2; }

 protected:
  Linear(const Linear& other, std::string kind) : Layer(other) { kind_ = std::move(kind); }
  /// Per-sample gradients in Param::grad_sample (and their norms when ctx asks).
  void instantiate(const Tensor& grad_out, BackwardContext& ctx);
  /// dL/dx, or empty when not asked for.
  Tensor input_grad(const Tensor& grad_out, const BackwardContext& ctx) const;
};

/// A Linear whose backward computes the per-sample norms itself by the hybrid rule (ghost when
/// 2T² <= d_in·d_out, else direct, fused with the weight-gradient pass) and keeps what
/// book-keeping needs: its output grads G (Param::grad = (diag(c) G)ᵀ A, bias Σ_i c_i Σ_t g_it),
/// or, in the direct regime when d_in <= T (per-sample grads no larger than G), the per-sample
/// grads A_iᵀG_i that the direct pass builds (Param::grad = Σ_i c_i A_iᵀG_i).
class FusedLinear : public Linear {
 public:
  /// The fused twin of `plain`, sharing its weights.
  explicit FusedLinear(const Linear& plain) : Linear(plain, "fused_linear") {}
  Tensor backward(const Tensor& grad_out, BackwardContext& ctx) override;
  void bookkeeping_grads(const Tensor& coef) override;
  void release() override;
  void drop_input() override;
  std::unique_ptr<Layer> clone() const override { return std::make_unique<FusedLinear>(*this); }

 private:
  Tensor kept_grad_ = {};
};

/// max(x, 0).
class Relu : public Layer {
 public:
  Relu() : Layer("relu") {}
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_out, BackwardContext& ctx) override;
  std::unique_ptr<Layer> clone() const override { return std::make_unique<Relu>(*this); }
};

/// GELU, erf form.
class Gelu : public Layer {
 public:
  Gelu() : Layer("gelu") {}
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_out, BackwardContext& ctx) override;
  std::unique_ptr<Layer> clone() const override { return std::make_unique<Gelu>(*this); }
};

/// RMSNorm over the last dim, eps 1e-5, per-feature scale [d]; the scale's per-sample
/// gradients (Σ_t g_t x̂_t, [B, d]) are always instantiated when norms are asked for.
class RmsNorm : public Layer {
 public:
  RmsNorm(Tensor scale, int index);
  std::int64_t out_features(std::int64_t in) const override;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_out, BackwardContext& ctx) override;
  std::unique_ptr<Layer> clone() const override { return std::make_unique<RmsNorm>(*this); }
};

}  // namespace meshtest::dp
