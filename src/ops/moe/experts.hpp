// experts: the gpt-oss MLP block after its norm — router, top-k, the routed experts and the
// weighted combine — as one op whose experts run as grouped GEMMs over the tokens each expert
// received.
#pragma once

#include "src/core/tensor.hpp"
#include "src/ops/moe/steps.hpp"
#include "src/ops/moe/types.hpp"

namespace meshtest {

/// The fused form of the MLP block's sequence after the norm (experts_reference):
///   r = route_top_k(linear(t, gate_weight, gate_bias), k)       (the router, as the block)
///   out[t] = Σ_j r.weights[t, j] · (mlp2_weight[e] · swiglu(mlp1_weight[e] · t[t] + mlp1_bias[e])
///                                  + mlp2_bias[e]),   e = r.experts[t, j]
///   t: [T, hidden], gate_weight: [E, hidden], gate_bias: [E], mlp1_weight: [E, 2I, hidden],
///   mlp1_bias: [E, 2I], mlp2_weight: [E, hidden, I], mlp2_bias: [E, hidden] or an unset Tensor
///   ->  [T, hidden], t's dtype
/// k = p.experts_per_token; swiglu uses p.swiglu_alpha / p.swiglu_limit (p.norm_eps is unused:
/// t is the normed activation). Rows 2c and 2c+1 of mlp1 are unit c's glu and linear halves.
///
/// How: the T*k routed slots are grouped by expert (make_permutation: experts ascending, tokens
/// ascending within one); the tokens are gathered once into that order; mlp1 runs as a grouped
/// GEMM (one GEMM per expert over exactly the rows it received, none for an expert without
/// tokens), swiglu over all rows at once, mlp2 as a grouped GEMM, and the rows are weighted and
/// summed back per token (unpermute). Each expert matrix is read at most once per call.
/// The gathered tokens and both GEMM outputs live in a scratch kept per signature (op, dtype,
/// t's shape, 2I, k, bias or not) in perf::program_cache(): [T*k, 2·hidden + 2I] values of the
/// compute type, held until the cache is cleared (with the cache off, a fresh one per call); the
/// swiglu output [T*k, I] is allocated per call.
///
/// Traceable: while a perf::Trace captures, the call records a compute step that reruns the
/// routing and the experts from the buffers of its inputs into the output's. The routing
/// depends on t's contents, so a replay routes and permutes again and allocates the
/// permutation and the swiglu output (the scratch comes from the program cache); a replay
/// equals the eager call on the same inputs bit for bit. T = 0 records no step.
///
/// No mlp2_bias (an unset Tensor): the weighted sum of the expert outputs without their bias:
/// the partial of a tensor-parallel device (the bias joins on one device of the TP axis only).
///
/// Numerics: f32 and f64 compute in their own type; bf16 computes in f32 and rounds where the
/// reference sequence rounds: the router logits and softmax weights (it runs linear and
/// route_top_k themselves), the mlp1 product, its bias sum, each swiglu step, the mlp2 product,
/// its bias sum, and the output once after the weighted sum over j ascending (f32). The
/// difference from the reference: nothing is stored between the steps (moe_experts writes a
/// [T, k, hidden] bf16 tensor that moe_combine reads back), which changes no value, and each
/// expert's GEMM runs on a view of the gathered rows, so results equal the reference's up to
/// the GEMM's summation order (bit for bit in practice; the tests allow rounding).
///
/// Throws Error (naming the op and the tensor) for t not of rank 2, a dtype other than f32,
/// f64 or bf16, a weight whose shape or dtype does not fit t and the others, k outside
/// [1, E], or a NaN gate logit (route_top_k). T = 0 gives [0, hidden].
Tensor experts(const Tensor& t, const Tensor& gate_weight, const Tensor& gate_bias,
               const Tensor& mlp1_weight, const Tensor& mlp1_bias, const Tensor& mlp2_weight,
               const Tensor& mlp2_bias, const MoeParams& p = {});

/// The reference sequence of experts, as mlp_block runs it after the norm:
///   moe_combine(moe_experts(t, route_top_k(linear(t, gate), k), mlp1, mlp2), r, mlp2_bias)
/// Same shapes as experts (mlp2_bias required); errors from those ops.
Tensor experts_reference(const Tensor& t, const Tensor& gate_weight, const Tensor& gate_bias,
                         const Tensor& mlp1_weight, const Tensor& mlp1_bias,
                         const Tensor& mlp2_weight, const Tensor& mlp2_bias,
                         const MoeParams& p = {});

}  // namespace meshtest
