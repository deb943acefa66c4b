// moe/balance: the load-balancing auxiliary loss and the placement of experts on devices.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "src/core/tensor.hpp"
#include "src/ops/moe/moe.hpp"

namespace meshtest {

/// Switch / GShard auxiliary loss: E · Σ_e f_e · P_e, where f_e is the fraction of the T*k
/// slots routed to expert e (so Σ f = 1) and P_e the mean over tokens of the router
/// probability of e (probs: [T, E], rows of a softmax over all experts). Equals 1 for perfectly
/// uniform routing and probabilities; E at the worst. Computed in f64. T = 0 gives 0.
/// Throws Error when probs is not [r.num_tokens, E] or an expert id is outside [0, E).
double load_balancing_loss(const Tensor& probs, const Routing& r);

/// Tokens (slots) per expert: counts[e] = #slots routed to e.   -> [E]
/// Throws Error for E < 1, a routing whose experts are not T*k long, or an id outside [0, E).
std::vector<std::int64_t> expert_load(const Routing& r, std::int64_t num_experts);

/// Experts placed on the devices of an axis.
struct ExpertPlacement {
  std::int64_t num_experts = 0;
  int num_devices = 0;
  std::vector<int> device_of;                         ///< [E]: the device holding expert e
  std::vector<std::vector<std::int64_t>> experts_of;  ///< [D]: its experts, ascending
  /// The position of expert e among its device's experts. Throws Error for e outside
  /// [0, E) or an e its device does not list.
  [[nodiscard]] std::int64_t local_index(std::int64_t e) const;
};

/// Contiguous blocks by the array_split rule: the first E % D devices hold ceil(E/D) experts,
/// the rest floor(E/D) (so with E < D the last devices hold none).
/// Throws Error for E < 1 or D < 1.
ExpertPlacement contiguous_placement(std::int64_t num_experts, int num_devices);

/// Balanced by load, greedy (longest-processing-time first): experts taken by load descending
/// (equal loads: lower id first), each given to the device with the least load so far (equal:
/// fewer experts, then lower device). Deterministic, so every device computes the same
/// placement from the same loads. load: [E] tokens per expert (expert_load), all >= 0.
/// Throws Error for an empty load, a negative load or D < 1.
ExpertPlacement balanced_placement(std::span<const std::int64_t> load, int num_devices);

/// Throws Error unless every expert in [0, E) is on exactly one device in [0, D) and the two
/// views agree (names the first expert missing or placed twice).
void check_placement(const ExpertPlacement& p);

/// The tokens (slots) each device receives under placement p: [D]. Throws Error for an
/// inconsistent p (check_placement) or a load that is not [E].
std::vector<std::int64_t> device_load(const ExpertPlacement& p, std::span<const std::int64_t> load);

}  // namespace meshtest
