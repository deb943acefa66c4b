// Per-sample losses of DP training (mse, cross entropy) and their gradients.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "src/core/tensor.hpp"

namespace meshtest::dp {

/// mse: ℓ_i = Σ_{t,j} (out_itj − y_itj)²;  ce: ℓ_i = Σ_t cross_entropy(out_it, y_it).
enum class LossKind { mse, ce };
/// mean: L = (1/B) Σ_i ℓ_i;  sum: L = Σ_i ℓ_i.
enum class Reduction { mean, sum };

/// Parses "mse" / "ce" and "mean" / "sum"; throw Error listing the accepted names.
LossKind loss_from_name(std::string_view name);
Reduction reduction_from_name(std::string_view name);
std::string_view loss_name(LossKind k);
std::string_view reduction_name(Reduction r);

/// The reduced loss, the per-sample losses and dL/d(out).
struct LossOutput {
  Tensor per_sample = {};  ///< [B], out's dtype
  Tensor grad = {};        ///< out's shape: dL/d(out) of the reduced loss L
  double total = 0;        ///< L
};

/// Losses of `out` against `target`.
///   mse: out [B, d] or [B, T, d], target: out's shape and dtype;
///   ce:  out [B, K] or [B, T, K] logits, target [B] or [B, T] integer classes (i32/i64) in [0, K).
/// `divisor` is the B of the mean (the global batch under data parallelism; default: out's B,
/// and 1 for an empty batch so nothing is divided by zero). Throws Error for shape, dtype or
/// class-range mismatches.
LossOutput loss_and_grad(const Tensor& out, const Tensor& target, LossKind kind,
                         Reduction reduction, std::int64_t divisor = -1);

}  // namespace meshtest::dp
