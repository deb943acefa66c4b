// moe/permute: token permutation for MoE — group the routed (token, slot) pairs by expert, drop
// what exceeds an expert's capacity, and undo it (unpermute) with the routing weights.
//
// A routing of T tokens with k experts each has T*k slots, slot s = t*k + j for token t's j-th
// expert. A Permutation lists the kept slots grouped by expert (ascending), slots ascending
// within an expert (so tokens keep their order: a stable sort by expert). Row i of the permuted
// tensor is token slots[i] / k; expert e owns rows [offsets[e], offsets[e+1]).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "src/core/tensor.hpp"
#include "src/ops/moe/types.hpp"

namespace meshtest {

/// Kept slots grouped by expert, and the dropped ones.
struct Permutation {
  std::int64_t num_tokens = 0;
  std::int64_t k = 0;
  std::int64_t num_experts = 0;
  std::vector<std::int64_t> slots;    ///< [rows]: the kept slots, by expert then ascending
  std::vector<std::int64_t> offsets;  ///< [E + 1]: expert e's rows are [offsets[e], offsets[e+1])
  std::vector<std::int64_t> dropped;  ///< slots dropped by capacity, ascending
  /// Rows of the permuted tensor (slots.size()).
  [[nodiscard]] std::int64_t rows() const { return static_cast<std::int64_t>(slots.size()); }
  /// Rows of expert e.
  [[nodiscard]] std::int64_t count(std::int64_t e) const { return offsets[e + 1] - offsets[e]; }
};

/// v1 (top-1): token t goes to expert expert_of[t]; tokens sorted by expert, stable.
/// Throws Error for an expert id outside [0, num_experts) (named with its token).
Permutation permute_top1(std::span<const std::int64_t> expert_of, std::int64_t num_experts);

/// v2 (top-k): every slot of the routing, so each token is copied to its k experts.
/// Throws Error for an expert id outside [0, num_experts) or a routing whose sizes disagree
/// (experts not T*k long, or weights, when set, not [T, k]).
Permutation make_permutation(const Routing& r, std::int64_t num_experts);

/// Which slots an expert over capacity drops.
enum class DropPolicy {
  TokenOrder,    ///< keep the first `capacity` slots in slot (token) order, drop the rest
  LowestWeight,  ///< keep the `capacity` slots of largest routing weight (ties: lower slot)
};

/// The capacity of each expert: ceil(T * k / E * factor), in double, capped at T * k (no
/// expert can receive more, so a huge factor keeps every slot). Throws Error for a negative or
/// non-finite factor (a factor of 0 gives capacity 0: every slot dropped), T < 0, k < 1 or
/// E < 1.
std::int64_t expert_capacity(std::int64_t num_tokens, std::int64_t k, std::int64_t num_experts,
                             double factor);

/// Drops the slots over `capacity` from every expert of `p` by `policy` (LowestWeight reads
/// the routing weights [T, k]); the dropped slots are added to p.dropped. Returns the number
/// dropped by this call. Throws Error for a negative capacity, an inconsistent p, or (for
/// LowestWeight) weights missing, of the wrong shape or holding a NaN.
std::int64_t apply_capacity(Permutation& p, std::int64_t capacity,
                            DropPolicy policy = DropPolicy::TokenOrder,
                            const Tensor* weights = nullptr);

/// Gathers the rows: out[i] = x[slots[i] / k].   x: [T, h] -> [rows, h], x's dtype (a copy).
Tensor permute(const Tensor& x, const Permutation& p);

/// Undoes permute and combines: out[t] = Σ_j weights[t, j] · y[row of slot t*k+j], a dropped
/// slot contributing zero (so a token whose slots all dropped gets a zero row: the caller's
/// residual is its output). The sum runs over j ascending in the compute type (f32 for bf16,
/// rounded once).
///   y: [rows, h], weights: [T, k] (y's dtype)  ->  [T, h]
Tensor unpermute(const Tensor& y, const Permutation& p, const Tensor& weights);

/// Throws Error unless p is a consistent permutation (offsets monotone from 0 to rows(), every
/// slot in [0, T*k) once across slots and dropped, each kept slot's routing in its segment when
/// r is given). The order of slots within a segment is not checked. Used by the
/// expert-parallel code on what it receives.
void check_permutation(const Permutation& p, const Routing* r = nullptr);

}  // namespace meshtest
