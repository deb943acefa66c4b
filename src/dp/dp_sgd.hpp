// DpSgd: single-device DP-SGD steps (clipped gradients by a mode, noise, optimizer).
#pragma once

#include <cstdint>
#include <string>

#include "src/dp/modes.hpp"
#include "src/dp/noise.hpp"
#include "src/dp/optimizer.hpp"

namespace meshtest::dp {

/// Options of a DP-SGD run.
struct DpSgdOptions {
  std::string mode = "fused_bk";
  DpOptions dp = {};
  NoiseOptions noise = {};
  OptimizerOptions optimizer = {};
};

/// What one step reports.
struct StepReport {
  Tensor norms = {};  ///< [B] per-sample gradient norms (empty for non_private)
  Tensor coef = {};   ///< [B] clip coefficients
  double loss = 0;
};

/// The divisor of the noisy sum: B for mean (1 for an empty batch), 1 for sum.
double noise_divisor(Reduction r, std::int64_t global_batch);

/// Noisy clipped gradient of one step: DpGrads::grads plus noise per parameter p (index in
/// model order) at `step`, divided as the reduction asks. Used by DpSgd and meshtest-run.
void add_step_noise(std::vector<Tensor>& grads, std::int64_t step, const DpSgdOptions& opt,
                    std::int64_t global_batch);

/// DP-SGD on one device: step() = clipped gradients (the mode) + noise N(0, (σC)²) keyed by
/// (seed, step, parameter, element) + optimizer update.
class DpSgd {
 public:
  DpSgd(Sequential model, DpSgdOptions opt);
  /// One step on the batch (x, y); throws Error for bad input before changing anything.
  StepReport step(const Tensor& x, const Tensor& y);
  const Sequential& model() const { return pm_.model(); }
  std::int64_t steps() const { return opt_state_.step(); }

 private:
  DpSgdOptions opt_;
  PrivateModel pm_;
  Optimizer opt_state_;
};

}  // namespace meshtest::dp
