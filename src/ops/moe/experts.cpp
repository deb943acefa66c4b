// experts: router, slots grouped per expert, grouped mlp1 GEMM, swiglu, grouped mlp2 GEMM and the
// weighted sum back per token, in one compute-type scratch kept by the program cache; under a
// perf::Trace capture the call is recorded as a step.
#include "src/ops/moe/experts.hpp"

#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "src/ops/activations.hpp"
#include "src/ops/compute.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/moe/permute.hpp"
#include "src/ops/moe/steps.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/program_cache.hpp"
#include "src/perf/trace.hpp"

namespace meshtest {
namespace {

using detail::compute_t;
using detail::ComputeMatrix;
using detail::round_all;

// The scratch of one signature: the tokens in expert order and the two grouped GEMM outputs.
template <class C>
struct ExpertsPlan : perf::Plan {
  RowMatrix<C> x;  // [T*k, hidden]
  RowMatrix<C> h;  // [T*k, 2I]: mlp1 + bias
  RowMatrix<C> y;  // [T*k, hidden]: mlp2 (+ bias)
};

// The expert weights of one call.
struct Weights {
  const Tensor& mlp1_weight;
  const Tensor& mlp1_bias;
  const Tensor& mlp2_weight;
  const Tensor* mlp2_bias;  // nullptr: no bias (a TP partial)
};

// out[seg_e] = round(in[seg_e] · W[e]ᵀ), then round(out + bias[e]) when bias is set, for every
// expert with rows (the rounding steps of moe_experts and moe_combine under S).
template <class S, class In>
void grouped_gemm_into(const In& in, const Permutation& perm, const Tensor& w, const Tensor* bias,
                       RowMatrix<compute_t<S>>& out) {
  const std::int64_t n_out = w.shape()[1], n_in = w.shape()[2];
  for (std::int64_t e = 0; e < perm.num_experts; ++e) {
    const std::int64_t r0 = perm.offsets[e], n = perm.count(e);
    if (n == 0) continue;
    const ComputeMatrix<S> we(w, e * n_out * n_in, n_out, n_in);
    auto seg = out.middleRows(r0, n);
    seg.noalias() = in.middleRows(r0, n) * we.map().transpose();
    round_all<S>(seg);
    if (bias == nullptr) continue;
    const ComputeMatrix<S> be(*bias, e * n_out, 1, n_out);
    seg.rowwise() += be.map().row(0);
    round_all<S>(seg);
  }
}

template <class S>
Tensor experts_impl(const Tensor& t, const Routing& r, const Permutation& perm, const Weights& w,
                    const MoeParams& p) {
  using C = compute_t<S>;
  const std::int64_t tokens = r.num_tokens, k = r.k, rows = tokens * k;
  const std::int64_t hidden = t.shape()[1], two_i = w.mlp1_weight.shape()[1];
  perf::Signature sig("experts");
  sig.add("t", t.shape(), t.dtype()).add("2I", two_i).add("k", k);
  sig.add("bias", w.mlp2_bias != nullptr ? 1 : 0);
  const auto plan = perf::program_cache().get<ExpertsPlan<C>>(sig, [&] {
    auto fresh = std::make_shared<ExpertsPlan<C>>();
    fresh->x.resize(rows, hidden);
    fresh->h.resize(rows, two_i);
    fresh->y.resize(rows, hidden);
    return fresh;
  });
  // Gather: row i is token slots[i] / k (bf16: t converted to f32 once).
  const ComputeMatrix<S> tc(t, 0, tokens, hidden);
  for (std::int64_t i = 0; i < rows; ++i) plan->x.row(i) = tc.map().row(perm.slots[i] / k);
  grouped_gemm_into<S>(plan->x, perm, w.mlp1_weight, &w.mlp1_bias, plan->h);
  const RowMatrix<C> a = detail::swiglu_rows<S>(plan->h, p.swiglu_alpha, p.swiglu_limit);
  grouped_gemm_into<S>(a, perm, w.mlp2_weight, w.mlp2_bias, plan->y);
  // Unpermute: out[t] = Σ_j weights[t, j] · y[row of slot t*k + j], j ascending, rounded once.
  std::vector<std::int64_t> row_of(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) row_of[perm.slots[i]] = i;
  const ComputeMatrix<S> wm(r.weights, 0, tokens, k);
  RowMatrix<C> out = RowMatrix<C>::Zero(tokens, hidden);
  for (std::int64_t tk = 0; tk < tokens; ++tk) {
    for (std::int64_t j = 0; j < k; ++j) {
      out.row(tk) += wm.map()(tk, j) * plan->y.row(row_of[tk * k + j]);
    }
  }
  return detail::to_tensor<S>(out, Shape{tokens, hidden});
}

// The work of a call after validation: routing, permutation and the grouped experts. A trace
// step reruns it (the routing follows the input, so the permutation is made again).
Tensor experts_body(const Tensor& t, const Tensor& gate_weight, const Tensor& gate_bias,
                    const Weights& w, const MoeParams& p) {
  const Routing r = route_top_k(linear(t, gate_weight, gate_bias), p.experts_per_token);
  const Permutation perm = make_permutation(r, gate_weight.shape()[0]);
  return detail::visit_floating(t.dtype(), "experts", [&]<class S>(type_tag<S>) {
    return experts_impl<S>(t, r, perm, w, p);
  });
}

}  // namespace

Tensor experts(const Tensor& t, const Tensor& gate_weight, const Tensor& gate_bias,
               const Tensor& mlp1_weight, const Tensor& mlp1_bias, const Tensor& mlp2_weight,
               const Tensor& mlp2_bias, const MoeParams& p) {
  constexpr std::string_view op = "experts";
  perf::OpScope scope(op, perf::OpScope::fused);  // one record: its router, permute not apart
  scope.input(t).input(gate_weight).input(gate_bias).input(mlp1_weight).input(mlp1_bias);
  scope.input(mlp2_weight);
  const bool bias = !detail::is_unset(mlp2_bias);
  if (bias) scope.input(mlp2_bias);
  scope.attr("k", p.experts_per_token).attr("bias", bias);
  detail::check_rank(op, "t ([T, hidden])", t, 2);
  MESHTEST_CHECK(is_floating(t.dtype()), "experts: t has dtype {}, expected f32, f64 or bf16",
                 t.dtype());
  check_moe_weights(op, gate_weight, gate_bias, mlp1_weight, mlp1_bias, mlp2_weight, mlp2_bias, p,
                    t.shape()[1], t.dtype(), /*mlp2_bias_optional=*/true);
  Tensor out = experts_body(t, gate_weight, gate_bias,
                            {mlp1_weight, mlp1_bias, mlp2_weight, bias ? &mlp2_bias : nullptr}, p);
  perf::Trace* trace = perf::Trace::active();
  if (trace != nullptr && t.numel() > 0) {
    std::vector<const Tensor*> ins{&t,           &gate_weight, &gate_bias,
                                   &mlp1_weight, &mlp1_bias,   &mlp2_weight};
    if (bias) ins.push_back(&mlp2_bias);
    const std::vector<const Tensor*> outs{&out};
    trace->add_tensor_step(
        op, perf::OpType::compute, ins, outs,
        [p](std::span<const Tensor* const> in, std::span<Tensor* const> o) {
          const Weights w{*in[3], *in[4], *in[5], in.size() > 6 ? in[6] : nullptr};
          const Tensor y = experts_body(*in[0], *in[1], *in[2], w, p);
          std::memcpy(o[0]->bytes(), y.bytes(), y.nbytes());
        });
  }
  // Router 2·T·hidden·E; per slot mlp1 (4·hidden·I), bias, swiglu, mlp2 (2·I·hidden), bias,
  // weighted sum.
  const double slots = static_cast<double>(t.shape()[0] * p.experts_per_token);
  const double h = static_cast<double>(t.shape()[1]);
  const double i = static_cast<double>(mlp2_weight.shape()[2]);
  const double router =
      2.0 * static_cast<double>(t.shape()[0]) * h * static_cast<double>(gate_weight.shape()[0]);
  scope.output(out).flops(router + slots * (6.0 * h * i + 2.0 * i + kSwigluFlops * i + 3.0 * h));
  return out;
}

Tensor experts_reference(const Tensor& t, const Tensor& gate_weight, const Tensor& gate_bias,
                         const Tensor& mlp1_weight, const Tensor& mlp1_bias,
                         const Tensor& mlp2_weight, const Tensor& mlp2_bias, const MoeParams& p) {
  const Routing r = route_top_k(linear(t, gate_weight, gate_bias), p.experts_per_token);
  return moe_combine(moe_experts(t, r, mlp1_weight, mlp1_bias, mlp2_weight, p), r, mlp2_bias);
}

}  // namespace meshtest
