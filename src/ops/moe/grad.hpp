// moe/grad: the backward of the routed expert MLP (moe_experts followed by moe_combine).
#pragma once

#include "src/core/tensor.hpp"
#include "src/ops/moe/moe.hpp"

namespace meshtest {

/// The gradients of out = moe_combine(moe_experts(t, r, mlp1_weight, mlp1_bias, mlp2_weight),
/// r, mlp2_bias), i.e. out[t] = Σ_j w[t,j] · (W2[e] · swiglu(W1[e] · t_t + b1[e]) + b2[e]) with
/// e = r.experts[t*k + j], with respect to every input. The routing (which experts) is held
/// fixed; its weights are an input (gradient through the softmax is the router's business).
struct MoeGrads {
  Tensor t;            ///< [T, hidden]
  Tensor weights;      ///< [T, k]: grad_out[t] · (y[t, j] + b2[e])
  Tensor mlp1_weight;  ///< [E, 2I, hidden] (zero for an expert with no tokens)
  Tensor mlp1_bias;    ///< [E, 2I]
  Tensor mlp2_weight;  ///< [E, hidden, I]
  Tensor mlp2_bias;    ///< [E, hidden]
};

/// Backward of the routed experts and combine, given grad_out [T, hidden]. The rows are grouped
/// by expert (make_permutation) and each expert's GEMMs run once over its rows (grouped_gemm
/// and its backward). f32 or f64; all tensors (routing.weights too) of one dtype; the shapes of
/// moe_experts, grad_out [T, hidden]. Throws Error for shapes or dtypes that disagree, bf16, or a
/// routing that does not fit t (its token count, T*k experts, ids outside [0, E), weights not
/// [T, k]).
MoeGrads moe_backward(const Tensor& t, const Routing& r, const Tensor& mlp1_weight,
                      const Tensor& mlp1_bias, const Tensor& mlp2_weight, const Tensor& mlp2_bias,
                      const Tensor& grad_out, const MoeParams& p = {});

}  // namespace meshtest
