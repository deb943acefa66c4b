// SGD and Adam on flat parameter tensors (whole parameters or FSDP shards alike).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "src/core/tensor.hpp"

namespace meshtest::dp {

enum class OptimizerKind { sgd, adam };

/// Optimizer hyper-parameters; Adam follows Kingma & Ba with bias correction.
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::sgd;
  double lr = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

/// Parses "sgd" / "adam"; throws Error listing both.
OptimizerKind optimizer_from_name(std::string_view name);

/// Element-wise update of a list of tensors (any shapes, f32/f64); the state of tensor k lives
/// in slot k. The update of element j depends only on element j's history, so a shard updated
/// alone equals the same elements of the whole tensor updated.
class Optimizer {
 public:
  explicit Optimizer(OptimizerOptions opt = {});
  /// Advances the step counter (Adam's bias correction uses it); call once per step.
  void next_step() { ++step_; }
  /// value -= update(grad) for slot k; value and grad have one shape and dtype.
  void update(std::size_t slot, Tensor& value, const Tensor& grad);
  std::int64_t step() const { return step_; }

 private:
  OptimizerOptions opt_;
  std::int64_t step_ = 0;
  std::vector<Tensor> m_, v_;
};

}  // namespace meshtest::dp
