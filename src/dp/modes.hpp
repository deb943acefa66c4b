// DP modes in a registry by name: non_private, hooks, ghost, fused, fused_bk. Every private mode
// returns the same clipped gradient sum; they differ in how they get the per-sample norms.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "src/dp/loss.hpp"
#include "src/dp/sequential.hpp"

namespace meshtest::dp {

/// Options of one clipped-gradient computation.
struct DpOptions {
  double clip = 1.0;  ///< C > 0
  LossKind loss = LossKind::mse;
  Reduction reduction = Reduction::mean;
  std::int64_t global_batch = -1;  ///< B of the mean (data parallel); -1: the input's B
};

/// Hooks of a data-parallel run: the layer hooks, and `all_of`, which ANDs a flag over every
/// rank (identity on one device) so that ranks take the same branches.
struct StepHooks {
  LayerHooks layers = {};
  std::function<bool(bool)> all_of = nullptr;
};

/// The result of one clipped-gradient computation on the local samples.
struct DpGrads {
  Tensor norms = {};  ///< [B] ‖∇θ ℓ_i‖ over all parameters (empty for non_private)
  Tensor coef = {};   ///< [B] c_i = min(1, C / (‖∇θ ℓ_i‖ + 1e-6)) (empty for non_private)
  std::vector<Tensor> grads = {};  ///< per parameter: Σ_i c_i ∇ℓ_i (÷ B for mean); no noise
  double loss = 0;                 ///< the reduced loss of the local samples
};

/// A mode: how the per-sample norms and the clipped sum are computed.
using ModeFn = DpGrads (*)(Sequential& model, const Tensor& x, const Tensor& y,
                           const DpOptions& opt, const StepHooks& hooks);
struct Mode {
  std::string name = {};
  std::string summary = {};
  bool fused_layers = false;  ///< wrapping replaces Linear with FusedLinear
  ModeFn run = nullptr;
};

/// Adds a mode to the registry; throws Error for an empty or taken name.
void register_mode(Mode mode);
/// The mode called `name`; throws Error naming it and listing the registered modes.
const Mode& find_mode(std::string_view name);
/// The registered names, sorted.
std::vector<std::string> mode_names();

/// Checks a batch against the model and options before any work (so data-parallel ranks can
/// agree on errors): x [B, d] or [B, T, d] with T >= 1 and d the model's input; y as the loss
/// needs; C > 0. Throws Error saying what is wrong.
void check_batch(const Sequential& model, const Tensor& x, const Tensor& y, const DpOptions& opt);

/// A model wrapped for a mode ("every mode wraps a model"): fused modes get FusedLinear layers.
class PrivateModel {
 public:
  PrivateModel(Sequential model, std::string_view mode, DpOptions opt);
  /// One forward and the mode's backward(s) on (x, y); the model's caches are released after.
  DpGrads compute(const Tensor& x, const Tensor& y, const StepHooks& hooks = {});
  Sequential& model() { return model_; }
  const Sequential& model() const { return model_; }
  const Mode& mode() const { return *mode_; }
  const DpOptions& options() const { return opt_; }

 private:
  Sequential model_;
  const Mode* mode_;
  DpOptions opt_;
};

}  // namespace meshtest::dp
