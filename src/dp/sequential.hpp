// Sequential: the small DP model container (Linear, ReLU, GELU, RMSNorm in order), its spec
// parser, and the utility that swaps plain Linear layers for fused ones.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/dp/layers.hpp"

namespace meshtest::dp {

/// Called around each layer's forward and backward with the layer's index: FSDP gathers the
/// layer's parameters in `before` and frees them in `after`. Unset hooks do nothing.
struct LayerHooks {
  std::function<void(std::size_t)> before = nullptr;
  std::function<void(std::size_t)> after = nullptr;
};

/// A sequence of layers; parameters are named as in a PyTorch nn.Sequential state dict.
/// Copies are deep (each layer cloned).
class Sequential {
 public:
  Sequential() = default;
  Sequential(const Sequential& other);
  Sequential& operator=(const Sequential& other);
  Sequential(Sequential&&) = default;
  Sequential& operator=(Sequential&&) = default;

  void add(std::unique_ptr<Layer> layer) { layers_.push_back(std::move(layer)); }
  std::size_t size() const { return layers_.size(); }
  Layer& layer(std::size_t i) { return *layers_.at(i); }
  const Layer& layer(std::size_t i) const { return *layers_.at(i); }
  /// Replaces layer i (used by replace_linear_with_fused).
  void set_layer(std::size_t i, std::unique_ptr<Layer> layer) { layers_.at(i) = std::move(layer); }

  /// Every parameter in order (layer, then weight before bias).
  std::vector<Param*> parameters();
  std::vector<const Param*> parameters() const;
  /// The dtype of the parameters (f64 when there are none).
  DType dtype() const;
  /// The output's last dim for an input with `in` features; throws Error on a mismatch.
  std::int64_t out_features(std::int64_t in) const;

  /// Runs every layer, caching what backward needs.   x: [B, d] or [B, T, d] -> [B, (T,) out]
  Tensor forward(const Tensor& x, const LayerHooks& hooks = {});
  /// Runs every layer's backward in reverse with `ctx` (the first layer skips its input grad).
  void backward(const Tensor& grad_out, BackwardContext& ctx, const LayerHooks& hooks = {});
  /// Drops cached activations, kept and per-sample grads.
  void release();
  /// Clears Param::grad and Param::grad_sample of every parameter.
  void zero_grads();

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
};

/// How parse_model initialises parameters: Linear weight and bias uniform on ±1/sqrt(in)
/// (PyTorch's default bound), RMSNorm scale uniform on [0.5, 1.5) (not PyTorch's ones, so that
/// tests exercise it), each from the counter-based generator keyed by (seed, parameter index).
struct InitOptions {
  std::uint64_t seed = 0;
};

/// Builds a model from a spec such as "linear:512,relu,linear:256,gelu,rmsnorm" for inputs with
/// `in_features` features. Linear layers have a bias. Throws Error for an unknown layer name,
/// a width <= 0 or a dtype other than f32/f64.
Sequential parse_model(std::string_view spec, std::int64_t in_features, DType dtype,
                       const InitOptions& init = {});

/// Replaces every plain Linear with a FusedLinear holding the same weights; returns how many.
int replace_linear_with_fused(Sequential& model);
/// The names (layer indices, as in the state dict) of the fused layers, in order.
std::vector<std::string> fused_modules(const Sequential& model);

}  // namespace meshtest::dp
