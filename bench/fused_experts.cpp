// The experts section of meshtest-bench fused: fused experts vs the MLP block's sequence vs a
// dense gather (per token, its k experts' matrices), single device.
#include "bench/fused_experts.hpp"

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <vector>

#include "bench/fused_common.hpp"
#include "src/check/gpt_oss_chains.hpp"
#include "src/core/random.hpp"
#include "src/ops/activations.hpp"
#include "src/ops/compute.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/moe/experts.hpp"

namespace meshtest::bench {
namespace {

using detail::compute_t;
using detail::ComputeMatrix;

struct Inputs {
  Tensor t, gate_weight, gate_bias, mlp1_weight, mlp1_bias, mlp2_weight, mlp2_bias;
};

Inputs make_inputs(const ExpertsBenchOptions& o) {
  const auto rnd = [&](Shape s, std::uint64_t stream, double std) {
    return random_normal(std::move(s), o.dtype, {.seed = o.seed, .stream = stream}, 0.0, std);
  };
  const double wh = 1 / std::sqrt(static_cast<double>(o.hidden));
  const double wi = 1 / std::sqrt(static_cast<double>(o.intermediate));
  const std::int64_t e = o.experts, h = o.hidden, i = o.intermediate;
  return {rnd(Shape{o.tokens, h}, 0, 1), rnd(Shape{e, h}, 1, wh),
          rnd(Shape{e}, 2, 0.5),         rnd(Shape{e, 2 * i, h}, 3, 2 * wh),
          rnd(Shape{e, 2 * i}, 4, 1),    rnd(Shape{e, h, i}, 5, wi),
          rnd(Shape{e, h}, 6, 0.5)};
}

// The dense gather: each token through each of its k experts alone (matrix-vector products),
// with the reference's roundings under S (bf16: each gathered expert matrix converted per use,
// as a gathered copy would be).
template <class S>
Tensor dense_impl(const Inputs& in, const Routing& r, const MoeParams& p) {
  using C = compute_t<S>;
  const std::int64_t hidden = in.t.shape()[1], two_i = in.mlp1_weight.shape()[1];
  const ComputeMatrix<S> t(in.t), w(r.weights);
  RowMatrix<C> out = RowMatrix<C>::Zero(r.num_tokens, hidden);
  RowMatrix<C> h(1, two_i), y(1, hidden);
  for (std::int64_t tk = 0; tk < r.num_tokens; ++tk) {
    for (std::int64_t j = 0; j < r.k; ++j) {
      const std::int64_t e = r.experts[tk * r.k + j];
      const ComputeMatrix<S> w1(in.mlp1_weight, e * two_i * hidden, two_i, hidden);
      const ComputeMatrix<S> b1(in.mlp1_bias, e * two_i, 1, two_i);
      const ComputeMatrix<S> w2(in.mlp2_weight, e * hidden * (two_i / 2), hidden, two_i / 2);
      const ComputeMatrix<S> b2(in.mlp2_bias, e * hidden, 1, hidden);
      h.noalias() = t.map().row(tk) * w1.map().transpose();
      detail::round_all<S>(h);
      h += b1.map();
      detail::round_all<S>(h);
      const RowMatrix<C> a = detail::swiglu_rows<S>(h, p.swiglu_alpha, p.swiglu_limit);
      y.noalias() = a * w2.map().transpose();
      detail::round_all<S>(y);
      y += b2.map();
      detail::round_all<S>(y);
      out.row(tk) += w.map()(tk, j) * y;
    }
  }
  return detail::to_tensor<S>(out, Shape{r.num_tokens, hidden});
}

Tensor dense_gather(const Inputs& in, const MoeParams& p) {
  const Routing r = route_top_k(linear(in.t, in.gate_weight, in.gate_bias), p.experts_per_token);
  return detail::visit_floating(in.t.dtype(), "dense_gather",
                                [&]<class S>(type_tag<S>) { return dense_impl<S>(in, r, p); });
}

// Median and min milliseconds of o.iters calls after o.warmup; `out` keeps the last result.
std::pair<double, double> time_ms(const ExpertsBenchOptions& o, const std::function<Tensor()>& f,
                                  Tensor& out) {
  return time_calls_ms<Tensor>(o.warmup, o.iters, f, out);
}

}  // namespace

ExpertsBenchResult experts_section(const ExpertsBenchOptions& o) {
  MESHTEST_CHECK(o.tokens >= 1 && o.hidden >= 1 && o.intermediate >= 1 && o.experts >= 1 &&
                     o.iters >= 1 && o.warmup >= 0,
                 "experts bench: tokens, hidden, intermediate, experts and iters must be >= 1 "
                 "and warmup >= 0; got {}, {}, {}, {}, {}, {}",
                 o.tokens, o.hidden, o.intermediate, o.experts, o.iters, o.warmup);
  MESHTEST_CHECK(o.k >= 1 && o.k <= o.experts, "experts bench: k is {}, expected 1 .. {}", o.k,
                 o.experts);
  const Inputs in = make_inputs(o);
  const MoeParams p{.experts_per_token = o.k};
  fmt::print(
      "experts (fused: router, grouped GEMMs over each expert's tokens, weighted sum) — {}, "
      "T {}, hidden {}, I {}, E {}, k {}; median of {} calls after {} warm-up\n",
      dtype_name(o.dtype), o.tokens, o.hidden, o.intermediate, o.experts, o.k, o.iters, o.warmup);
  ExpertsBenchResult res;
  Tensor fused, seq, dense;
  const auto [fused_ms, fused_min] = time_ms(
      o,
      [&] {
        return experts(in.t, in.gate_weight, in.gate_bias, in.mlp1_weight, in.mlp1_bias,
                       in.mlp2_weight, in.mlp2_bias, p);
      },
      fused);
  const auto [seq_ms, seq_min] = time_ms(
      o,
      [&] {
        return experts_reference(in.t, in.gate_weight, in.gate_bias, in.mlp1_weight, in.mlp1_bias,
                                 in.mlp2_weight, in.mlp2_bias, p);
      },
      seq);
  res.fused_ms = fused_ms;
  res.sequence_ms = seq_ms;
  res.sequence_error = scaled_error(seq, fused);
  // bf16: the fused op rounds where the sequence does (two bf16 ulps); f32 and f64 add the
  // chain's terms in another order (the error model's bound per unit of scale).
  const double bound =
      o.dtype == DType::bf16
          ? std::ldexp(1.0, -7)
          : error_bound(experts_chain(o.hidden, o.intermediate, o.k).model(o.dtype), 1.0, 1.0);
  res.outputs_agree = res.sequence_error <= bound;
  fmt::print("  {:<56} {:>10} {:>10} {:>9} {:>10}\n", "", "median ms", "min ms", "/ fused",
             "max err");
  fmt::print("  {:<56} {:>10.1f} {:>10.1f} {:>9} {:>10}\n", "experts (fused)", fused_ms, fused_min,
             "1.00", "");
  fmt::print("  {:<56} {:>10.1f} {:>10.1f} {:>9.2f} {:>10.2g}\n",
             "sequence: linear, route_top_k, moe_experts, moe_combine", seq_ms, seq_min,
             seq_ms / fused_ms, res.sequence_error);
  if (o.dense) {
    const auto [dense_ms, dense_min] = time_ms(
        o, [&] { return dense_gather(in, p); }, dense);
    res.dense_ms = dense_ms;
    res.dense_error = scaled_error(dense, fused);
    res.outputs_agree = res.outputs_agree && res.dense_error <= bound;
    fmt::print("  {:<56} {:>10.1f} {:>10.1f} {:>9.2f} {:>10.2g}\n",
               "dense gather: each token through its k experts alone", dense_ms, dense_min,
               dense_ms / fused_ms, res.dense_error);
  }
  fmt::print("  outputs agree (max err / max |ref| <= {:.2g}): {}\n", bound,
             res.outputs_agree ? "PASS" : "FAIL");
  if (o.dense) {
    const double ratio = res.dense_ms / res.fused_ms;
    fmt::print(
        "  target: fused >= 2 x faster than the dense-gather reference at "
        "T 1024, E 32, k 4: {:.2f} x {}{}\n",
        ratio, ratio >= 2 ? "meets" : "MISSES",
        o.tokens == 1024 && o.experts == 32 && o.k == 4 ? "" : " (other sizes here)");
  }
  fmt::print(
      "  note: moe_experts already runs one GEMM per expert over its tokens, so the MLP "
      "block's sequence is itself grouped: the same GEMMs as the fused op, which saves only the "
      "[T, k, hidden] tensor between moe_experts and moe_combine and reuses its scratch\n");
  return res;
}

}  // namespace meshtest::bench
