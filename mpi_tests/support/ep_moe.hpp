// Shared pieces of the expert-parallel MPI tests: the mesh shapes of a world size, an MoE
// problem (config, full weights, inputs, routing) with the single-device references, the
// capacity rule written as a plain loop, and the local rows / expert slices to compare with.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dist/parallel/expert_parallel.hpp"
#include "src/check/compare.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/models/gpt_oss_weights.hpp"
#include "src/ops/elementwise.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/moe/grad.hpp"
#include "src/ops/moe/moe.hpp"
#include "src/ops/rms_norm.hpp"

namespace meshtest::dist::ep_test {

/// A mesh of the test and its EP axis.
struct EpMesh {
  int rows = 1;
  int cols = 1;
  int ep_axis = 1;
};

/// The meshes run at world size n: the 1-D mesh 1 x n with EP over every device; for a
/// composite n the R x C mesh with R the largest divisor <= sqrt(n) (2x4 at 8, 4x8 at 32) with
/// EP on axis 0 (TP on axis 1) and the reverse; for n prime (or 1) instead n x 1 with EP on
/// axis 0 and 1 x n with EP on axis 0 (one EP device, TP over all).
inline std::vector<EpMesh> ep_meshes(int n) {
  std::vector<EpMesh> out{{1, n, 1}};
  int r = 1;
  for (int d = 2; d * d <= n; ++d) {
    if (n % d == 0) r = d;
  }
  if (r > 1) {
    out.push_back({r, n / r, 0});
    out.push_back({r, n / r, 1});
  } else {
    if (n > 1) out.push_back({n, 1, 0});
    out.push_back({1, n, 0});
  }
  return out;
}

/// One MoE problem.
struct EpCase {
  std::string name;
  std::int64_t tokens = 11;
  std::int64_t experts = 5;
  std::int64_t k = 2;
  std::int64_t hidden = 16;
  std::int64_t units_per_tp = 2;  ///< intermediate units per TP device (I = units_per_tp · tp)
  DType dtype = DType::f64;
  ExpertAssignment assignment = ExpertAssignment::Contiguous;
  std::optional<double> capacity = std::nullopt;
  DropPolicy policy = DropPolicy::TokenOrder;
  std::int64_t only_expert = -1;  ///< >= 0: a gate that ranks this expert first for every token
  std::uint64_t seed = 1;
};

/// The full problem, the same on every device, with the single-device pieces.
struct Problem {
  GptOssConfig config;
  MlpWeights full;
  Tensor x;                        ///< [T, hidden]
  Tensor grad_out;                 ///< [T, hidden]
  Tensor t;                        ///< rms_norm(x)
  Routing r;                       ///< route_top_k of the whole t
  std::vector<std::int64_t> load;  ///< [E]: slots per expert (counted here)
  std::vector<bool> dropped;       ///< [T * k]: by the capacity rule below
  Routing kept;                    ///< r with the weights of the dropped slots zeroed
};

/// The capacity rule in plain loops: cap = ceil(T k / E · factor); TokenOrder keeps the first
/// cap slots of each expert in slot order, LowestWeight the cap of largest weight (ties: lower
/// slot).
inline std::vector<bool> dropped_slots(const Routing& r, std::int64_t experts, double factor,
                                       DropPolicy policy) {
  const std::int64_t slots = r.num_tokens * r.k;
  const auto cap = static_cast<std::int64_t>(
      std::ceil(static_cast<double>(slots) / static_cast<double>(experts) * factor));
  std::vector<bool> dropped(static_cast<std::size_t>(slots), false);
  for (std::int64_t e = 0; e < experts; ++e) {
    std::vector<std::int64_t> mine;
    for (std::int64_t s = 0; s < slots; ++s) {
      if (r.experts[s] == e) mine.push_back(s);
    }
    if (policy == DropPolicy::LowestWeight) {
      std::stable_sort(mine.begin(), mine.end(), [&](std::int64_t a, std::int64_t b) {
        return r.weights.item(a) > r.weights.item(b);
      });
    }
    for (std::size_t i = static_cast<std::size_t>(cap); i < mine.size(); ++i) {
      dropped[static_cast<std::size_t>(mine[i])] = true;
    }
  }
  return dropped;
}

/// Builds the problem of `c` for a TP axis of `tp` devices (intermediate c.units_per_tp · tp).
inline Problem make_problem(const EpCase& c, int tp) {
  Problem pb;
  pb.config = GptOssConfig::tiny();
  pb.config.num_experts = c.experts;
  pb.config.experts_per_token = c.k;
  pb.config.hidden_size = c.hidden;
  pb.config.intermediate_size = c.units_per_tp * tp;
  pb.full = init_mlp_weights(pb.config, 0, c.dtype, RandomInit{c.seed});
  if (c.only_expert >= 0) {  // equal logits but one: ties go to the lower ids
    std::vector<double> bias(static_cast<std::size_t>(c.experts), 0.0);
    bias[static_cast<std::size_t>(c.only_expert)] = 4.0;
    pb.full.gate_weight = Tensor(Shape{c.experts, c.hidden}, c.dtype);
    pb.full.gate_bias = Tensor::from_vector(Shape{c.experts}, bias).astype(c.dtype);
  }
  pb.x = random_normal(Shape{c.tokens, c.hidden}, c.dtype, {.seed = c.seed + 100, .stream = 1});
  pb.grad_out =
      random_normal(Shape{c.tokens, c.hidden}, c.dtype, {.seed = c.seed + 200, .stream = 2});
  const MoeParams p = pb.config.moe_params();
  pb.t = rms_norm(pb.x, pb.full.norm_scale, p.norm_eps);
  pb.r = route_top_k(linear(pb.t, pb.full.gate_weight, pb.full.gate_bias), c.k);
  pb.load.assign(static_cast<std::size_t>(c.experts), 0);
  for (const std::int64_t e : pb.r.experts) ++pb.load[static_cast<std::size_t>(e)];
  pb.dropped = c.capacity ? dropped_slots(pb.r, c.experts, *c.capacity, c.policy)
                          : std::vector<bool>(pb.r.experts.size(), false);
  pb.kept = pb.r;
  Tensor w64 = pb.r.weights.astype(DType::f64);
  for (std::size_t s = 0; s < pb.dropped.size(); ++s) {
    if (pb.dropped[s]) w64.span<double>()[s] = 0.0;
  }
  pb.kept.weights = w64.astype(c.dtype);
  return pb;
}

/// Number of dropped slots.
inline std::int64_t count_dropped(const Problem& pb) {
  return std::count(pb.dropped.begin(), pb.dropped.end(), true);
}

/// The single-device block output: mlp_block without capacity, else the residual plus the
/// combine with the dropped slots' weights zeroed.
inline Tensor reference_block(const Problem& pb, bool capacity) {
  const MoeParams p = pb.config.moe_params();
  if (!capacity) return mlp_block(pb.x, pb.full, p);
  const Tensor y =
      moe_experts(pb.t, pb.r, pb.full.mlp1_weight, pb.full.mlp1_bias, pb.full.mlp2_weight, p);
  return add(pb.x, moe_combine(y, pb.kept, pb.full.mlp2_bias));
}

/// The single-device grads (moe_backward with the dropped slots' weights zeroed; their weight
/// grads zeroed too: a dropped slot does not touch the output).
inline MoeGrads reference_grads(const Problem& pb) {
  MoeGrads g =
      moe_backward(pb.t, pb.kept, pb.full.mlp1_weight, pb.full.mlp1_bias, pb.full.mlp2_weight,
                   pb.full.mlp2_bias, pb.grad_out, pb.config.moe_params());
  Tensor w64 = g.weights.astype(DType::f64);
  for (std::size_t s = 0; s < pb.dropped.size(); ++s) {
    if (pb.dropped[s]) w64.span<double>()[s] = 0.0;
  }
  g.weights = w64.astype(g.weights.dtype());
  return g;
}

/// Tokens [range) of a routing.
inline Routing local_routing(const Routing& r, Range range) {
  const auto begin = r.experts.begin() + range.start * r.k;
  return {.num_tokens = range.size,
          .k = r.k,
          .experts = std::vector<std::int64_t>(begin, begin + range.size * r.k),
          .weights = r.weights.slice(0, range)};
}

/// The given experts (dim 0) of a per-expert tensor, then [range) along `dim` (dim 0: none).
inline Tensor expert_slice(const Tensor& full, const std::vector<std::int64_t>& experts,
                           int dim = 0, Range range = {}) {
  Shape shape = full.shape();
  shape = shape.with(0, static_cast<std::int64_t>(experts.size()));
  if (dim > 0) shape = shape.with(dim, range.size);
  Tensor out(shape, full.dtype());
  for (std::size_t i = 0; i < experts.size(); ++i) {
    Tensor one = full.slice(0, experts[i], 1);
    out.assign_slice(0, static_cast<std::int64_t>(i), dim > 0 ? one.slice(dim, range) : one);
  }
  return out;
}

/// n of the error model (src/check/tolerance.hpp) for each result of a problem: the terms added
/// to make one element, over the chain of reductions behind it.
struct ChainTerms {
  std::int64_t block = 1;             ///< the block output (forward)
  std::int64_t grad_t = 1;            ///< MoeGrads::t
  std::int64_t grad_weights = 1;      ///< MoeGrads::weights
  std::int64_t grad_mlp1 = 1;         ///< MoeGrads::mlp1_weight and mlp1_bias
  std::int64_t grad_mlp2_weight = 1;  ///< MoeGrads::mlp2_weight
  std::int64_t grad_mlp2_bias = 1;    ///< MoeGrads::mlp2_bias
};

/// The terms of `pb`'s results with the intermediate units split over a TP axis of `tp` devices.
inline ChainTerms chain_terms(const Problem& pb, int tp) {
  const std::int64_t h = pb.config.hidden_size, i = pb.config.intermediate_size;
  const std::int64_t k = pb.config.experts_per_token, tokens = pb.x.shape()[0];
  // An expert's output y: mlp1 over hidden with its bias, mlp2 over the I units (each TP
  // device's partial, then the all_reduce over tp).
  const std::int64_t y = h + 1 + i + tp;
  // dh, the grad of mlp1's output: mlp1 again (h + 1, through swiglu's derivative) and the
  // grad of the activation, mlp2ᵀ over hidden.
  const std::int64_t dh = h + 1 + h;
  return {
      // rms_norm's sum of squares, the router logits (hidden + bias), y, the combine over the k
      // slots (each with its mlp2 bias) and the residual.
      .block = h + h + 1 + y + 2 * k + 1,
      // mlp1ᵀ over the 2·I units of each of the k experts (TP partials all_reduced over tp).
      .grad_t = dh + 2 * i * k + tp,
      // grad_out · (y + mlp2 bias) over hidden.
      .grad_weights = y + 1 + h,
      // dh (or dh ⊗ t) summed over the tokens routed to the expert.
      .grad_mlp1 = dh + tokens,
      // the activation (mlp1 over hidden with its bias) ⊗ weighted grad_out, over the tokens.
      .grad_mlp2_weight = h + 1 + tokens,
      .grad_mlp2_bias = tokens,
  };
}

/// The magnitude of each routing-weight grad's terms (f64, [T, k]): weights[t, j] is the dot
/// product Σ_h grad_out[t, h] (y[t, j, h] + mlp2_bias[e, h]), so its terms' magnitude is
/// Σ_h |grad_out[t, h]| |y[t, j, h] + mlp2_bias[e, h]|. Per element: a device may hold one token,
/// too few elements for max |expected| to stand for the terms of a sum that cancels.
inline Tensor grad_weights_scale(const Problem& pb) {
  const Tensor y = moe_experts(pb.t, pb.r, pb.full.mlp1_weight, pb.full.mlp1_bias,
                               pb.full.mlp2_weight, pb.config.moe_params())
                       .astype(DType::f64);
  const Tensor g = pb.grad_out.astype(DType::f64), b2 = pb.full.mlp2_bias.astype(DType::f64);
  const std::int64_t tokens = pb.r.num_tokens, k = pb.r.k, h = pb.config.hidden_size;
  Tensor scale(Shape{tokens, k}, DType::f64);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t e = pb.r.experts[static_cast<std::size_t>(t * k + j)];
      double sum = 0;
      for (std::int64_t i = 0; i < h; ++i) {
        sum += std::abs(g.span<double>()[t * h + i]) *
               std::abs(y.span<double>()[(t * k + j) * h + i] + b2.span<double>()[e * h + i]);
      }
      scale.span<double>()[t * k + j] = sum;
    }
  }
  return scale;
}

/// Expects `got` within the error model of `want` (src/check/tolerance.hpp): the same f32 or f64
/// computation in another order, `terms` terms per element over its chain (chain_terms), with
/// the tensor's scale max |want| (the problems' inputs are zero-mean random) or each element's
/// `scale`. Equal shapes and dtypes required.
inline void expect_close(const Tensor& got, const Tensor& want, std::int64_t terms,
                         const std::string& label, const std::optional<Tensor>& scale = {}) {
  ASSERT_EQ(got.shape(), want.shape()) << label;
  ASSERT_EQ(got.dtype(), want.dtype()) << label;
  ASSERT_TRUE(want.dtype() == DType::f32 || want.dtype() == DType::f64) << label;
  const ErrorModel m{.dtype = want.dtype(), .terms = terms, .reference = Reference::other_order};
  const Comparison c = scale ? compare(want, got, m, *scale) : compare(want, got, m);
  EXPECT_TRUE(c.passed) << label << ": " << c;
}

}  // namespace meshtest::dist::ep_test
